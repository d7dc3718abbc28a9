# Installation and the CMake package: find_package(tilejit) then link tilejit::tilejit.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS tilejit EXPORT tilejitTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# Headers keep their source-tree paths under include/tilejit (dsl/ holds dsl/ir/).
foreach(dir dsl jit runtime kernels api)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tilejit/${dir}
    FILES_MATCHING PATTERN "*.hpp")
endforeach()
install(FILES ${PROJECT_BINARY_DIR}/include/tilejit/tilejit.hpp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tilejit)

# Installed programs find libtilejit through a relative RPATH ($ORIGIN, then the way from their
# folder to the library's): no LD_LIBRARY_PATH or ldconfig, and the prefix can be moved.
function(tilejit_install_program target destination)
  file(RELATIVE_PATH to_lib ${CMAKE_INSTALL_PREFIX}/${destination} ${CMAKE_INSTALL_FULL_LIBDIR})
  set_target_properties(${target} PROPERTIES INSTALL_RPATH "$ORIGIN/${to_lib}")
  install(TARGETS ${target} RUNTIME DESTINATION ${destination})
endfunction()
tilejit_install_program(tilejit_cli ${CMAKE_INSTALL_BINDIR})
# The examples (README "Examples") under libexec/tilejit/examples, bundle_app with its bundle.
if(TILEJIT_BUILD_EXAMPLES)
  set(_tilejit_examples ${CMAKE_INSTALL_LIBEXECDIR}/tilejit/examples)
  foreach(example vector_add softmax gemm attention bundle_app)
    tilejit_install_program(example_${example} ${_tilejit_examples})
  endforeach()
  install(FILES ${PROJECT_BINARY_DIR}/examples/bundle_app.tjb DESTINATION ${_tilejit_examples})
endif()
# The C ABI (bindings/c, issue 25): libtilejit_c beside libtilejit, which it finds through
# $ORIGIN, and its C header; a binding (ctypes, torch) loads it by path.
set_target_properties(tilejit_c PROPERTIES INSTALL_RPATH "$ORIGIN")
install(TARGETS tilejit_c LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES ${PROJECT_SOURCE_DIR}/bindings/c/tilejit_c.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tilejit/bindings/c)
install(EXPORT tilejitTargets NAMESPACE tilejit:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tilejit)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/tilejitConfig.cmake.in
  ${PROJECT_BINARY_DIR}/tilejitConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tilejit)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/tilejitConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/tilejitConfig.cmake ${PROJECT_BINARY_DIR}/tilejitConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tilejit)
