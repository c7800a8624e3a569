# cmake -DSOURCE_DIR=... -DBINARY_DIR=... (-DHINTS=<prefix> | -DKVC_DIR=<dir>) -DGENERATOR=...
#       [-DMAKE_PROGRAM=...] [-DCXX_COMPILER=...] [-DBUILD_TYPE=...] [-DCUDA_ROOT=...]
#       -DEXPECT_CONFIG_DIR=... -DEXPECT_VERSION=... -DEXPECT_CUDA=0|1 -P consumer.cmake
# Configures, builds and runs the consumer project from an empty build folder, then configures
# and builds it a second time in the same folder: a package config that only works once (targets
# defined twice, cached paths that go stale) fails here.
cmake_minimum_required(VERSION 3.25)

foreach(v SOURCE_DIR BINARY_DIR GENERATOR EXPECT_CONFIG_DIR EXPECT_VERSION EXPECT_CUDA)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "consumer.cmake: -D${v}=... is required")
  endif()
endforeach()

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc COMMAND_ECHO STDOUT)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer: ${what} failed (${rc})")
  endif()
endfunction()

set(configure_args -S ${SOURCE_DIR} -B ${BINARY_DIR} -G ${GENERATOR}
    -DKVC_EXPECT_CONFIG_DIR=${EXPECT_CONFIG_DIR} -DKVC_EXPECT_VERSION=${EXPECT_VERSION}
    -DKVC_EXPECT_CUDA=${EXPECT_CUDA})
if(MAKE_PROGRAM)
  list(APPEND configure_args -DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM})
endif()
if(CXX_COMPILER)
  list(APPEND configure_args -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
endif()
if(BUILD_TYPE)
  list(APPEND configure_args -DCMAKE_BUILD_TYPE=${BUILD_TYPE})
endif()
if(HINTS)
  list(APPEND configure_args -DKVC_HINTS=${HINTS})
endif()
if(KVC_DIR)
  list(APPEND configure_args -Dkvc_DIR=${KVC_DIR})
endif()
if(CUDA_ROOT)
  list(APPEND configure_args -DCUDAToolkit_ROOT=${CUDA_ROOT})
endif()

file(REMOVE_RECURSE ${BINARY_DIR})
run_step("first configure" ${CMAKE_COMMAND} ${configure_args})
run_step("first build" ${CMAKE_COMMAND} --build ${BINARY_DIR})
run_step("run" ${BINARY_DIR}/kvc_consumer)
run_step("second configure" ${CMAKE_COMMAND} ${configure_args})
run_step("second build" ${CMAKE_COMMAND} --build ${BINARY_DIR})
