# The NCCL communicator, the GPU EP path and the cuBLAS MoE layer
# (src/comm/nccl -> library epx_nccl), built when CUDA and NCCL are found,
# and the CLI's link to them. The GPU test skips itself (exit 77) where no
# device is visible, as in CI.
if(NOT EPX_HAVE_CUDA)
  target_compile_definitions(epx_cli PRIVATE EPX_CLI_HAVE_NCCL=0)
  return()
endif()
find_path(EPX_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
find_library(EPX_NCCL_LIB nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
if(NOT EPX_NCCL_INCLUDE OR NOT EPX_NCCL_LIB)
  message(STATUS "epx: NCCL communicator skipped (nccl.h or libnccl not found)")
  target_compile_definitions(epx_cli PRIVATE EPX_CLI_HAVE_NCCL=0)
  return()
endif()
message(STATUS "epx: NCCL communicator enabled (${EPX_NCCL_LIB})")

file(GLOB EPX_NCCL_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/comm/nccl/*.c
     ${CMAKE_SOURCE_DIR}/src/comm/nccl/*.cu ${CMAKE_SOURCE_DIR}/src/engine/*.cu
     ${CMAKE_SOURCE_DIR}/src/comm/gpu/transport_nccl.cu)
add_library(epx_nccl STATIC ${EPX_NCCL_SOURCES} $<TARGET_OBJECTS:epx_llgpu_objs>)
target_include_directories(epx_nccl PUBLIC ${CMAKE_SOURCE_DIR}/include
                           PRIVATE ${CMAKE_SOURCE_DIR}/src/core ${CMAKE_SOURCE_DIR}/src/comm
                                   ${CMAKE_SOURCE_DIR}/src/comm/nccl ${CMAKE_SOURCE_DIR}/src/comm/gpu)
target_include_directories(epx_nccl SYSTEM PUBLIC ${EPX_NCCL_INCLUDE})
target_compile_options(epx_nccl PRIVATE $<$<COMPILE_LANGUAGE:C>:${EPX_WARNINGS} -fvisibility=hidden>
                       $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -lineinfo -Xcompiler=-fvisibility=hidden>)
target_link_libraries(epx_nccl PUBLIC epx_static CUDA::cudart CUDA::cublas ${EPX_NCCL_LIB})

target_link_libraries(epx_cli PRIVATE epx_nccl)
target_compile_definitions(epx_cli PRIVATE EPX_CLI_HAVE_NCCL=1)

if(NOT EPX_BUILD_TESTS)
  return()
endif()
add_executable(test_nccl_ep ${CMAKE_SOURCE_DIR}/tests/nccl/test_nccl_ep.c)
target_compile_options(test_nccl_ep PRIVATE ${EPX_WARNINGS})
target_link_libraries(test_nccl_ep PRIVATE epx_nccl epx_testutil)
add_test(NAME gpu_nccl_ep COMMAND test_nccl_ep)
set_tests_properties(gpu_nccl_ep PROPERTIES LABELS "gpu;no-asan" SKIP_RETURN_CODE 77 TIMEOUT 300
                     ENVIRONMENT "${EPX_TEST_ENV};NCCL_NVLS_ENABLE=0")

# The low-latency GPU engine: one rank, and 2-4 ranks as processes sharing
# the GPU over CUDA IPC. Plain C with no cmocka, so it runs on GPU machines
# that lack it.
add_executable(test_gpu_ll ${CMAKE_SOURCE_DIR}/tests/comm_gpu/test_gpu_ll.c)
target_compile_options(test_gpu_ll PRIVATE ${EPX_WARNINGS})
target_include_directories(test_gpu_ll PRIVATE ${CMAKE_SOURCE_DIR}/tests/util
                                               ${CMAKE_SOURCE_DIR}/src/comm/gpu
                                               ${CMAKE_SOURCE_DIR}/src/core)
target_link_libraries(test_gpu_ll PRIVATE epx_nccl)
target_link_options(test_gpu_ll PRIVATE -Wl,--as-needed)
add_test(NAME gpu_ll COMMAND test_gpu_ll)
set_tests_properties(gpu_ll PROPERTIES LABELS "gpu;no-asan" SKIP_RETURN_CODE 77 TIMEOUT 900
                     ENVIRONMENT "${EPX_TEST_ENV}")
