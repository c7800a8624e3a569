# Libraries of the mini-decoder example, shared by the program (examples/mini_decoder) and its
# tests (tests/mini_decoder): whichever directory comes first defines them, once.
include_guard(GLOBAL)

set(KVC_MINI_DECODER_DIR ${CMAKE_CURRENT_LIST_DIR})

# GGUF reader and dequantisation.
add_library(kvc_gguf STATIC ${KVC_MINI_DECODER_DIR}/gguf.cpp)
target_include_directories(kvc_gguf PUBLIC ${KVC_MINI_DECODER_DIR})
target_link_libraries(kvc_gguf PUBLIC kvc::kvc)
target_compile_options(kvc_gguf PRIVATE -Wall -Wextra)

# Byte-level BPE tokenizer and the ChatML prompt builder.
add_library(kvc_bpe STATIC ${KVC_MINI_DECODER_DIR}/tokenizer.cpp)
target_link_libraries(kvc_bpe PUBLIC kvc_gguf)
target_compile_options(kvc_bpe PRIVATE -Wall -Wextra)

# Kernels, KV caches (dense f32 and kvc), model, sampler and command line; with CUDA also the
# model on the device.
add_library(kvc_llama STATIC
  ${KVC_MINI_DECODER_DIR}/kernels.cpp
  ${KVC_MINI_DECODER_DIR}/thread_pool.cpp
  ${KVC_MINI_DECODER_DIR}/kv_cache.cpp
  ${KVC_MINI_DECODER_DIR}/kvc_cache.cpp
  ${KVC_MINI_DECODER_DIR}/retrieval_prompts.cpp
  ${KVC_MINI_DECODER_DIR}/retrieval_run.cpp
  ${KVC_MINI_DECODER_DIR}/model.cpp
  ${KVC_MINI_DECODER_DIR}/gemma_model.cpp
  ${KVC_MINI_DECODER_DIR}/decoder_model.cpp
  ${KVC_MINI_DECODER_DIR}/sampler.cpp
  ${KVC_MINI_DECODER_DIR}/cli.cpp
  ${KVC_MINI_DECODER_DIR}/decoder.cpp
  ${KVC_MINI_DECODER_DIR}/eval_cache.cpp
  ${KVC_MINI_DECODER_DIR}/teacher_forced.cpp)
target_link_libraries(kvc_llama PUBLIC kvc_gguf kvc_bpe)
target_compile_options(kvc_llama PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>)

# The forward on a CUDA device (cuda_model.h): kernels, the device dense cache and the model
# (cuBLAS GEMMs). --fmad=false: no product fused into an FMA that the CPU kernels do not do.
if(KVC_CUDA_ENABLED)
  target_sources(kvc_llama PRIVATE
    ${KVC_MINI_DECODER_DIR}/cuda_kernels.cu
    ${KVC_MINI_DECODER_DIR}/cuda_kv_cache.cpp
    ${KVC_MINI_DECODER_DIR}/cuda_model.cpp
    ${KVC_MINI_DECODER_DIR}/cuda_gemma_model.cpp)
  target_link_libraries(kvc_llama PUBLIC CUDA::cudart CUDA::cublas)
  target_compile_options(kvc_llama PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--fmad=false -Xcompiler=-Wall,-Wextra>)
endif()
# The kernels are optimised even in Debug builds: an unoptimised GEMM makes the tests crawl.
set_source_files_properties(${KVC_MINI_DECODER_DIR}/kernels.cpp PROPERTIES COMPILE_OPTIONS -O3)
