// AMX tile state shared by the kernels that use tiles (amx_linear.cpp, prefill_attention.cpp): the
// 64-byte tile configuration and Linux's per-process permission. Defines RAPID_LLM_HAS_AMX where the
// compiler targets AMX-BF16 and AVX512-BF16 (-march=native on such a CPU); elsewhere it declares nothing.
#pragma once

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define RAPID_LLM_HAS_AMX 1

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace amx_tiles {

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// Linux hands out AMX's tile state only to processes that ask for it (arch_prctl, XTILEDATA = 18).
inline bool tile_state_granted() {
  static const bool granted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18) == 0;
  return granted;
}

}  // namespace amx_tiles

#endif
