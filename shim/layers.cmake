# The layers of shim/layers.txt as the build enforces them (included by the top level before
# policy/ and shim/, which use these functions).

# The table: ALLOCSHIM_LAYER_DIR_<layer> and ALLOCSHIM_LAYER_SEES_<layer> (itself and what it may include).
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/layers.txt)
file(STRINGS ${CMAKE_CURRENT_LIST_DIR}/layers.txt allocshim_layer_lines REGEX "^[a-z]")
foreach(line IN LISTS allocshim_layer_lines)
  string(REGEX REPLACE "[ \t]+" ";" fields "${line}")
  list(POP_FRONT fields layer dir)
  list(REMOVE_ITEM fields "-")
  set(ALLOCSHIM_LAYER_DIR_${layer} ${PROJECT_SOURCE_DIR}/${dir})
  set(ALLOCSHIM_LAYER_SEES_${layer} ${layer} ${fields})
endforeach()
set(ALLOCSHIM_LAYERS_DIR ${PROJECT_BINARY_DIR}/layers CACHE INTERNAL "include folders of the layers")

# Gives `target` the include folder of `layer`: links, named as the includes spell them ("core/"),
# to the folders of the layers it may include, and nothing else. Made anew at each configure.
function(allocshim_layer_includes target layer)
  set(view ${ALLOCSHIM_LAYERS_DIR}/${layer})
  file(GLOB old LIST_DIRECTORIES true ${view}/*)
  foreach(link IN LISTS old)
    file(REMOVE ${link})
  endforeach()
  file(MAKE_DIRECTORY ${view})
  foreach(seen IN LISTS ALLOCSHIM_LAYER_SEES_${layer})
    if(DEFINED ALLOCSHIM_LAYER_DIR_${seen})
      get_filename_component(name ${ALLOCSHIM_LAYER_DIR_${seen}} NAME)
      file(CREATE_LINK ${ALLOCSHIM_LAYER_DIR_${seen}} ${view}/${name} SYMBOLIC)
    endif()
  endforeach()
  target_include_directories(${target} PRIVATE ${view})
  if(cuda IN_LIST ALLOCSHIM_LAYER_SEES_${layer})
    target_include_directories(${target} SYSTEM PRIVATE ${ALLOCSHIM_CUDA_INCLUDE})
  endif()
endfunction()

# One layer of the library: objects compiled with the layer's include folder (hidden visibility: the
# library's export list decides what leaves it), and a twin for the tests, sanitized when
# ALLOCSHIM_SANITIZE is on (the preloaded library never is; without sanitizers the twin is the same).
function(allocshim_layer layer)
  cmake_parse_arguments(L "" "" "SOURCES" ${ARGN})
  add_library(allocshim_${layer}_objects OBJECT ${L_SOURCES})
  allocshim_layer_includes(allocshim_${layer}_objects ${layer})
  target_link_libraries(allocshim_${layer}_objects PRIVATE allocshim_policy allocshim_os Threads::Threads)
  target_compile_options(allocshim_${layer}_objects PRIVATE -fvisibility=hidden)
  if(ALLOCSHIM_SANITIZE)
    add_library(allocshim_${layer}_objects_test OBJECT ${L_SOURCES})
    allocshim_layer_includes(allocshim_${layer}_objects_test ${layer})
    target_link_libraries(allocshim_${layer}_objects_test PRIVATE allocshim_policy allocshim_os Threads::Threads)
    target_compile_options(allocshim_${layer}_objects_test PRIVATE -fvisibility=hidden ${ALLOCSHIM_SAN_FLAGS})
  endif()
endfunction()
