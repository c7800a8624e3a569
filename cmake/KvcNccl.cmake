# NCCL for the context-parallel communicator (kvc/parallel/context_parallel.h). Included by the
# top-level CMakeLists.txt after KvcCuda.cmake.
#
#   KVC_WITH_NCCL  AUTO (default): use NCCL when CUDA is on and nccl.h / libnccl are found (the
#                  CUDA toolkit's /usr/local/cuda first); ON: require it; OFF: build without it.
#
# Sets KVC_NCCL_ENABLED (ON/OFF) for the rest of the build (tests/parallel builds its NCCL test
# binary when it is ON). With NCCL, src/cuda/parallel_nccl.cu is compiled with
# KVC_NCCL_ENABLED=1 and kvc links libnccl; without it, the NCCL entry points throw kvc::Error.
# The library target does not exist yet when this runs, so the settings are applied to it at the
# end of the top-level directory (cmake_language(DEFER)).
include_guard(GLOBAL)

set(KVC_WITH_NCCL "AUTO" CACHE STRING "Build the NCCL communicator: AUTO, ON or OFF")
set_property(CACHE KVC_WITH_NCCL PROPERTY STRINGS AUTO ON OFF)

set(KVC_NCCL_ENABLED OFF)
if(NOT KVC_WITH_NCCL STREQUAL "OFF")
  if(NOT KVC_CUDA_ENABLED)
    if(KVC_WITH_NCCL STREQUAL "ON")
      message(FATAL_ERROR "kvc: KVC_WITH_NCCL=ON needs CUDA (KVC_WITH_CUDA is off or no nvcc)")
    endif()
    message(STATUS "kvc: NCCL off (CUDA is off)")
  else()
    set(_kvc_cuda_hints)
    if(CUDAToolkit_INCLUDE_DIRS)
      list(APPEND _kvc_cuda_hints ${CUDAToolkit_INCLUDE_DIRS})
    endif()
    find_path(KVC_NCCL_INCLUDE_DIR nccl.h HINTS /usr/local/cuda/include ${_kvc_cuda_hints}
              PATH_SUFFIXES include)
    find_library(KVC_NCCL_LIBRARY nccl
                 HINTS /usr/local/cuda/lib64 ${CUDAToolkit_LIBRARY_DIR}
                 PATH_SUFFIXES lib64 lib)
    if(KVC_NCCL_INCLUDE_DIR AND KVC_NCCL_LIBRARY)
      set(KVC_NCCL_ENABLED ON)
      message(STATUS "kvc: NCCL on (${KVC_NCCL_LIBRARY})")
    elseif(KVC_WITH_NCCL STREQUAL "ON")
      message(FATAL_ERROR "kvc: KVC_WITH_NCCL=ON but nccl.h / libnccl were not found "
                          "(looked in /usr/local/cuda and the CUDA toolkit; set "
                          "KVC_NCCL_INCLUDE_DIR and KVC_NCCL_LIBRARY)")
    else()
      message(STATUS "kvc: NCCL off (nccl.h / libnccl not found)")
    endif()
  endif()
endif()

function(_kvc_apply_nccl)
  if(NOT TARGET kvc)
    message(FATAL_ERROR "kvc: cmake/KvcNccl.cmake expects the `kvc` library target")
  endif()
  if(KVC_NCCL_ENABLED)
    target_compile_definitions(kvc PRIVATE KVC_NCCL_ENABLED=1)
    target_include_directories(kvc PRIVATE ${KVC_NCCL_INCLUDE_DIR})
    target_link_libraries(kvc PRIVATE ${KVC_NCCL_LIBRARY})
  else()
    target_compile_definitions(kvc PRIVATE KVC_NCCL_ENABLED=0)
  endif()
endfunction()
cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL _kvc_apply_nccl)
