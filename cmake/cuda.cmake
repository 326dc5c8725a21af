# GPU targets: the tests in tests/gpu (each compares a kernel with its CPU
# reference and exits 77, a CTest skip, when no GPU is present -- CI has
# nvcc but no GPU) and the CUDA benchmarks in bench/*.cu. Included from
# CMakeLists.txt; does nothing unless the CUDA kernels (epx_cuda) are built.
if(NOT EPX_HAVE_CUDA OR NOT TARGET epx_cuda)
  return()
endif()

# The GPU programs are also carried to GPU machines that may lack the
# project's other libraries: link only what they use.
set(EPX_GPU_LINK_OPTIONS -Wl,--as-needed)

file(GLOB EPX_GPU_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/gpu/test_*.c
     ${CMAKE_SOURCE_DIR}/tests/gpu/test_*.cu)
foreach(src ${EPX_GPU_TESTS})
  get_filename_component(name ${src} NAME_WE)
  add_executable(${name} ${src})
  target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR}/src/core
                                             ${CMAKE_SOURCE_DIR}/tests/util)
  if(src MATCHES "\\.c$")
    target_compile_options(${name} PRIVATE ${EPX_WARNINGS})
  endif()
  target_link_libraries(${name} PRIVATE epx_cuda CUDA::cudart)
  target_link_options(${name} PRIVATE ${EPX_GPU_LINK_OPTIONS})
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES ENVIRONMENT "${EPX_TEST_ENV}" SKIP_RETURN_CODE 77
                       LABELS gpu WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
endforeach()

file(GLOB EPX_GPU_BENCHES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/bench/*.cu)
foreach(src ${EPX_GPU_BENCHES})
  get_filename_component(name ${src} NAME_WE)
  add_executable(bench_${name} ${src})
  target_include_directories(bench_${name} PRIVATE ${CMAKE_SOURCE_DIR}/src/core
                                                   ${CMAKE_SOURCE_DIR}/tests/util)
  target_compile_options(bench_${name} PRIVATE -O3)
  target_link_libraries(bench_${name} PRIVATE epx_cuda CUDA::cudart)
  target_link_options(bench_${name} PRIVATE ${EPX_GPU_LINK_OPTIONS})
  set_target_properties(bench_${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
endforeach()
