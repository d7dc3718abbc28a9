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
install(EXPORT tilejitTargets NAMESPACE tilejit:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tilejit)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/tilejitConfig.cmake.in
  ${PROJECT_BINARY_DIR}/tilejitConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tilejit)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/tilejitConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/tilejitConfig.cmake ${PROJECT_BINARY_DIR}/tilejitConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tilejit)
