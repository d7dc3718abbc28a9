# The layers of libtilejit, in their one direction: ir -> dsl -> jit -> runtime -> kernels -> api.
#
# Each layer is an OBJECT library whose include path is a tree of links (build/layers/LAYER/) to
# its own folder and the folders of the layers below it, and to nothing else. An #include against
# the direction ("runtime/..." in jit/, "kernels/..." in runtime/) therefore does not resolve and
# the build fails. The objects of every layer are linked into the one shared libtilejit; programs
# on top of it (tools, tests, benchmarks) see the whole source tree.
set(TILEJIT_LAYERS ir dsl jit runtime kernels api)
set(TILEJIT_LAYER_FOLDER_ir dsl/ir)
set(TILEJIT_LAYER_FOLDER_dsl dsl)
set(TILEJIT_LAYER_FOLDER_jit jit)
set(TILEJIT_LAYER_FOLDER_runtime runtime)
set(TILEJIT_LAYER_FOLDER_kernels kernels)
set(TILEJIT_LAYER_FOLDER_api api)

set(_tilejit_below "")
foreach(layer ${TILEJIT_LAYERS})
  set(tree ${PROJECT_BINARY_DIR}/layers/${layer})
  file(REMOVE_RECURSE ${tree})
  # dsl/ holds dsl/ir/: a layer that sees dsl sees ir through it
  set(visible ${_tilejit_below} ${TILEJIT_LAYER_FOLDER_${layer}})
  list(REMOVE_ITEM visible dsl/ir)
  if(layer STREQUAL "ir")
    set(visible dsl/ir)
  endif()
  foreach(folder ${visible})
    get_filename_component(parent ${tree}/${folder} DIRECTORY)
    file(MAKE_DIRECTORY ${parent})
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${folder} ${tree}/${folder} SYMBOLIC)
  endforeach()

  add_library(tilejit_${layer} OBJECT)
  target_include_directories(tilejit_${layer} PRIVATE ${tree})
  target_compile_options(tilejit_${layer} PRIVATE ${TILEJIT_WARNINGS} -ffunction-sections -fdata-sections)
  target_link_libraries(tilejit_${layer} PRIVATE fmt::fmt-header-only)
  set_target_properties(tilejit_${layer} PROPERTIES CXX_VISIBILITY_PRESET default)
  # the declared dependency on the layer below (its objects arrive through libtilejit)
  if(_tilejit_previous)
    add_dependencies(tilejit_${layer} tilejit_${_tilejit_previous})
  endif()
  target_link_libraries(tilejit PRIVATE tilejit_${layer})
  list(APPEND _tilejit_below ${TILEJIT_LAYER_FOLDER_${layer}})
  set(_tilejit_previous ${layer})
endforeach()
