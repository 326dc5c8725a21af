# The MPI communicator (src/comm/mpi -> library epx_mpi), its multi-rank
# tests, and the CLI's link to it. Included from CMakeLists.txt after the
# core targets and tests exist; does nothing when MPI was not found.
#
# Multi-rank tests run real processes under mpirun. They carry the label
# "mpi" and also "no-asan": Open MPI's own allocations make LeakSanitizer
# noisy, and the ASan pass (ctest -LE no-asan) covers the same EP code
# through tests/test_ep.c, which runs the ranks as threads.
if(NOT EPX_HAVE_MPI)
  target_compile_definitions(epx_cli PRIVATE EPX_CLI_HAVE_MPI=0)
  return()
endif()

file(GLOB EPX_MPI_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/comm/mpi/*.c)
add_library(epx_mpi STATIC ${EPX_MPI_SOURCES})
target_include_directories(epx_mpi PUBLIC ${CMAKE_SOURCE_DIR}/include
                           PRIVATE ${CMAKE_SOURCE_DIR}/src/core)
target_compile_options(epx_mpi PRIVATE ${EPX_WARNINGS} -fvisibility=hidden)
target_link_libraries(epx_mpi PUBLIC epx_static MPI::MPI_C)

# The CLI runs `epx bench comm --backend mpi` under mpirun.
target_link_libraries(epx_cli PRIVATE epx_mpi)
target_compile_definitions(epx_cli PRIVATE EPX_CLI_HAVE_MPI=1)

if(NOT EPX_BUILD_TESTS)
  return()
endif()
if(NOT MPIEXEC_EXECUTABLE)
  message(STATUS "epx: MPI found but no mpirun/mpiexec: multi-rank tests skipped")
  return()
endif()

# Open MPI in containers and CI: run as root, more ranks than cores, no
# single-copy shared memory (CMA needs ptrace rights containers often lack),
# yield when idle so oversubscribed ranks let each other run.
set(EPX_MPI_ENV
    "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1"
    "OMPI_MCA_btl_vader_single_copy_mechanism=none;OMPI_MCA_mpi_yield_when_idle=1"
    "OMPI_MCA_btl=self,vader;OMPI_MCA_oob_tcp_if_include=lo"
    "OMPI_MCA_hwloc_base_binding_policy=none")
set(EPX_MPIRUN ${MPIEXEC_EXECUTABLE} --oversubscribe --allow-run-as-root)

add_executable(test_mpi_ep ${CMAKE_SOURCE_DIR}/tests/mpi/test_mpi_ep.c)
target_compile_options(test_mpi_ep PRIVATE ${EPX_WARNINGS})
target_link_libraries(test_mpi_ep PRIVATE epx_mpi epx_testutil)
add_executable(mpi_fault ${CMAKE_SOURCE_DIR}/tests/mpi/mpi_fault.c)
target_compile_options(mpi_fault PRIVATE ${EPX_WARNINGS})
target_link_libraries(mpi_fault PRIVATE epx_mpi)

foreach(np 2 3 4)
  add_test(NAME mpi_ep_np${np} COMMAND ${EPX_MPIRUN} -np ${np} $<TARGET_FILE:test_mpi_ep>)
  set_tests_properties(mpi_ep_np${np} PROPERTIES LABELS "mpi;no-asan" TIMEOUT 180
                       ENVIRONMENT "${EPX_TEST_ENV};${EPX_MPI_ENV}" RUN_SERIAL TRUE)
endforeach()
foreach(mode kill stop)
  add_test(NAME mpi_fault_${mode}
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/mpi/fault.sh ${MPIEXEC_EXECUTABLE} 3
                   $<TARGET_FILE:mpi_fault> ${mode})
  set_tests_properties(mpi_fault_${mode} PROPERTIES LABELS "mpi;no-asan" TIMEOUT 120
                       ENVIRONMENT "${EPX_TEST_ENV};${EPX_MPI_ENV}" RUN_SERIAL TRUE)
endforeach()
# The low-latency protocol with a killed rank: the survivors time out.
add_test(NAME mpi_fault_kill_low_latency
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/mpi/fault.sh ${MPIEXEC_EXECUTABLE} 3
                 $<TARGET_FILE:mpi_fault> kill low-latency)
set_tests_properties(mpi_fault_kill_low_latency PROPERTIES LABELS "mpi;no-asan" TIMEOUT 120
                     ENVIRONMENT "${EPX_TEST_ENV};${EPX_MPI_ENV}" RUN_SERIAL TRUE)

# The CLI test of `epx bench comm --backend mpi` starts MPI: keep it out of
# the ASan pass too.
if(TEST cli_bench_comm)
  set_tests_properties(cli_bench_comm PROPERTIES LABELS "mpi;no-asan" RUN_SERIAL TRUE)
  set_property(TEST cli_bench_comm APPEND PROPERTY ENVIRONMENT "${EPX_MPI_ENV}")
endif()
