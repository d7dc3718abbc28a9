# LLVM 19 linked statically into libtilejit: only the NVPTX backend and the optimiser, with zlib
# and zstd linked statically and z3/libxml2 dropped, so the library needs nothing but glibc and
# travels to the GPU machine (which has no LLVM). Unused sections are garbage-collected.
find_package(LLVM 19.1 REQUIRED CONFIG HINTS /usr/lib/llvm-19/lib/cmake/llvm)
message(STATUS "tilejit: LLVM ${LLVM_PACKAGE_VERSION} from ${LLVM_DIR}")

# Debian's LLVMSupport asks for the shared z3, zlib and zstd; the pieces of LLVM we use call none
# of z3, and compression goes static.
find_library(TILEJIT_ZLIB_STATIC NAMES libz.a REQUIRED)
find_library(TILEJIT_ZSTD_STATIC NAMES libzstd.a REQUIRED)
set_property(TARGET LLVMSupport PROPERTY INTERFACE_LINK_LIBRARIES
  "rt;dl;m;${TILEJIT_ZLIB_STATIC};${TILEJIT_ZSTD_STATIC};LLVMDemangle")

llvm_map_components_to_libnames(TILEJIT_LLVM_LIBS
  core passes ipo nvptxcodegen nvptxdesc nvptxinfo mc support target)

# Only the two LLVM translation units (jit/llvm_backend/) see LLVM's headers (and their flags).
# (-isystem: LLVM's headers are not held to our warning flags.)
set(_tilejit_llvm_flags)
foreach(dir ${LLVM_INCLUDE_DIRS})
  list(APPEND _tilejit_llvm_flags -isystem ${dir})
endforeach()
separate_arguments(_tilejit_llvm_defs UNIX_COMMAND "${LLVM_DEFINITIONS}")
set_source_files_properties(${PROJECT_SOURCE_DIR}/jit/llvm_backend/emitter.cpp ${PROJECT_SOURCE_DIR}/jit/llvm_backend/gpu_ops.cpp PROPERTIES
  COMPILE_OPTIONS "${_tilejit_llvm_flags};${_tilejit_llvm_defs}")
target_link_libraries(tilejit PRIVATE ${TILEJIT_LLVM_LIBS})
target_link_options(tilejit PRIVATE -Wl,--gc-sections -Wl,--as-needed -Wl,--exclude-libs,ALL)
