# The CUDA prologue and the Philox generator go into every generated kernel as text: embed
# codegen/cuda/cuda_prologue.cuh and codegen/philox.h as string literals in
# <out_dir>/codegen/cuda_prologue.inc (rewritten only when they change; CMake reconfigures when
# either file does). Used by codegen/ and by the fuzzers' build.
function(lazyfuse_embed_cuda_prologue codegen_dir out_dir)
  set(sources ${codegen_dir}/cuda/cuda_prologue.cuh ${codegen_dir}/philox.h)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${sources})
  file(READ ${codegen_dir}/cuda/cuda_prologue.cuh prologue_text)
  file(READ ${codegen_dir}/philox.h philox_text)
  # NVRTC sees philox.h with its #pragma once, which is harmless there.
  file(WRITE ${out_dir}/codegen/cuda_prologue.inc.tmp
    "// Generated from codegen/cuda/cuda_prologue.cuh and codegen/philox.h; do not edit.\n"
    "constexpr const char kCudaPrologue[] = R\"lf_prologue(${prologue_text})lf_prologue\";\n"
    "constexpr const char kPhiloxSource[] = R\"lf_prologue(${philox_text})lf_prologue\";\n")
  file(COPY_FILE ${out_dir}/codegen/cuda_prologue.inc.tmp ${out_dir}/codegen/cuda_prologue.inc
       ONLY_IF_DIFFERENT)
endfunction()
