# Installs tilejit into a scratch prefix, then, as a user would with nothing else set up:
# - runs the installed CLI and an installed example with no LD_LIBRARY_PATH (their RPATH finds
#   the prefix's libtilejit, and no other),
# - configures, builds and runs tests/consumer against it with find_package(tilejit),
# - builds examples/plugin (a plugin of the user's kernels) against it with the installed headers
#   only, and has the installed CLI list its kernel and compile it to PTX.
file(REMOVE_RECURSE ${SCRATCH})
set(prefix ${SCRATCH}/prefix)
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix} RESULT_VARIABLE r OUTPUT_QUIET)
if(NOT r EQUAL 0)
  message(FATAL_ERROR "install failed")
endif()

# Runs ARGN with LD_LIBRARY_PATH unset; fails unless it exits 0 with output matching `expect`.
function(run_installed what expect)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH ${ARGN}
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE r)
  if(NOT r EQUAL 0 OR NOT "${out}${err}" MATCHES "${expect}")
    message(FATAL_ERROR "${what}: exit ${r}, expected output matching '${expect}':\n${out}${err}")
  endif()
endfunction()

run_installed("the installed CLI" "gemm .*attention_fwd" ${prefix}/bin/tilejit kernels)
find_program(LDD ldd)
if(LDD)
  run_installed("the installed CLI's libtilejit" "libtilejit.so.0 => ${prefix}/" ${LDD} ${prefix}/bin/tilejit)
endif()
# the C ABI's library and header (a binding loads libtilejit_c by path: its RPATH finds libtilejit)
foreach(f ${prefix}/include/tilejit/bindings/c/tilejit_c.h ${prefix}/lib/libtilejit_c.so)
  if(NOT EXISTS ${f})
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()
if(LDD)
  run_installed("the installed libtilejit_c's libtilejit" "libtilejit.so.0 => ${prefix}/" ${LDD} ${prefix}/lib/libtilejit_c.so)
endif()
if(EXAMPLES)
  run_installed("the installed vector_add example" "vector_add \\(" ${prefix}/libexec/tilejit/examples/vector_add)
endif()

# Configures and builds the project in `source` against the installed prefix, as a user would.
function(build_against_prefix what source build)
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${source} -B ${build} -G Ninja -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release
                  RESULT_VARIABLE r)
  if(NOT r EQUAL 0)
    message(FATAL_ERROR "configuring ${what} against the installed tilejit failed")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${build} RESULT_VARIABLE r)
  if(NOT r EQUAL 0)
    message(FATAL_ERROR "building ${what} against the installed tilejit failed")
  endif()
endfunction()

build_against_prefix("the consumer project" ${SOURCE_DIR}/tests/consumer ${SCRATCH}/build)
execute_process(COMMAND ${SCRATCH}/build/consumer RESULT_VARIABLE r)
if(NOT r EQUAL 0)
  message(FATAL_ERROR "the consumer program failed")
endif()

build_against_prefix("examples/plugin" ${SOURCE_DIR}/examples/plugin ${SCRATCH}/plugin)
set(plugin ${SCRATCH}/plugin/librow_scale_add.so)
run_installed("the installed CLI with the plugin" "row_scale_add .*\\[from --plugin " ${prefix}/bin/tilejit --plugin ${plugin} kernels)
run_installed("the installed CLI compiling the plugin's kernel" "row_scale_add: [0-9]+ threads"
              ${prefix}/bin/tilejit --plugin ${plugin} compile row_scale_add --emit ptx -o ${SCRATCH}/plugin_out)
file(READ ${SCRATCH}/plugin_out/row_scale_add.ptx ptx)
if(NOT ptx MATCHES "\\.entry row_scale_add")
  message(FATAL_ERROR "the plugin kernel's PTX has no entry row_scale_add")
endif()
message(STATUS "installed CLI, example and a plugin built against the installed headers: all work without LD_LIBRARY_PATH")
