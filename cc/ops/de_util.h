// Small building blocks of the native dynamic-embedding table: key hashing, the
// 8-slot control-byte group used by the open-addressing index, a counter-based
// random generator with a ziggurat normal sampler (rows of < 16 columns and
// truncated normals; wider rows: de_draw.h), and page-backed slab memory.
#ifndef TFRA_DE_CC_OPS_DE_UTIL_H_
#define TFRA_DE_CC_OPS_DE_UTIL_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__linux__)
#include <sys/mman.h>
#endif
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace tfra_de {

// ---------------------------------------------------------------- hashing --

inline uint64_t Mix64(uint64_t x) {
  // Murmur3 finaliser: every input bit affects every output bit, which the
  // index relies on (top bits pick the shard, low bits the slot and tag).
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

inline uint64_t HashBytes(const char* p, size_t n) {
  // Word-at-a-time multiply/rotate hash, finished with Mix64. Keys are short
  // feature strings, so simplicity beats a vectorised hash here.
  uint64_t h = 0x9e3779b97f4a7c15ULL ^ (static_cast<uint64_t>(n) * 0xc2b2ae3d27d4eb4fULL);
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h ^= w * 0x87c37b91114253d5ULL;
    h = (h << 31) | (h >> 33);
    h *= 0x4cf5ad432745937fULL;
    p += 8;
    n -= 8;
  }
  uint64_t tail = 0;
  if (n > 0) std::memcpy(&tail, p, n);
  h ^= tail * 0x87c37b91114253d5ULL;
  return Mix64(h);
}

// ------------------------------------------------------------ slot groups --
// An index slot is one uint32: kEmptySlot, kDeletedSlot, or a full slot
// (7-bit hash tag << 25 | row id). Keeping the tag next to the row id makes a
// probe one cache miss, not two (separate control bytes + row ids). Tags are
// 0..0x7E, so a full slot never has the all-ones top bits of the two markers.
// Probes test a group of 8 slots (32 bytes, half a cache line) at once.

constexpr uint32_t kEmptySlot = 0xFFFFFFFFu;
constexpr uint32_t kDeletedSlot = 0xFFFFFFFEu;
constexpr int kRowBits = 25;
constexpr uint32_t kRowMask = (1u << kRowBits) - 1;  // also the row limit per shard
constexpr int kGroupWidth = 8;

inline uint32_t TagOf(uint64_t h) {
  const uint32_t t = static_cast<uint32_t>(h & 0x7f);
  return t == 0x7f ? 0x7e : t;
}
inline uint32_t FullSlot(uint64_t h, uint32_t row) { return (TagOf(h) << kRowBits) | row; }

struct SlotGroup {
#if defined(__SSE2__)
  __m128i lo, hi;
  explicit SlotGroup(const uint32_t* p)
      : lo(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
        hi(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4))) {}
  static uint32_t Bits(__m128i a, __m128i b) {
    return static_cast<uint32_t>(_mm_movemask_ps(_mm_castsi128_ps(a)) |
                                 (_mm_movemask_ps(_mm_castsi128_ps(b)) << 4));
  }
  // Bit j set where slot j is full with this tag (a tag, not yet a key match).
  uint32_t Match(uint32_t tag) const {
    const __m128i t = _mm_set1_epi32(static_cast<int>(tag));
    return Bits(_mm_cmpeq_epi32(_mm_srli_epi32(lo, kRowBits), t),
                _mm_cmpeq_epi32(_mm_srli_epi32(hi, kRowBits), t));
  }
  uint32_t MaskEmpty() const {
    const __m128i e = _mm_set1_epi32(-1);
    return Bits(_mm_cmpeq_epi32(lo, e), _mm_cmpeq_epi32(hi, e));
  }
  uint32_t MaskEmptyOrDeleted() const {  // slot >> 1 == 0x7FFFFFFF
    const __m128i e = _mm_set1_epi32(0x7FFFFFFF);
    return Bits(_mm_cmpeq_epi32(_mm_srli_epi32(lo, 1), e), _mm_cmpeq_epi32(_mm_srli_epi32(hi, 1), e));
  }
#else
  uint32_t v[kGroupWidth];
  explicit SlotGroup(const uint32_t* p) { std::memcpy(v, p, sizeof(v)); }
  uint32_t Match(uint32_t tag) const {
    uint32_t m = 0;
    for (int j = 0; j < kGroupWidth; ++j) m |= static_cast<uint32_t>((v[j] >> kRowBits) == tag) << j;
    return m;
  }
  uint32_t MaskEmpty() const {
    uint32_t m = 0;
    for (int j = 0; j < kGroupWidth; ++j) m |= static_cast<uint32_t>(v[j] == kEmptySlot) << j;
    return m;
  }
  uint32_t MaskEmptyOrDeleted() const {
    uint32_t m = 0;
    for (int j = 0; j < kGroupWidth; ++j) m |= static_cast<uint32_t>(v[j] >= kDeletedSlot) << j;
    return m;
  }
#endif
};

inline int LowestSlot(uint32_t mask) { return __builtin_ctz(mask); }

// ------------------------------------------------------ random numbers --
// Initial rows are a pure function of (seed, key): the same key gets the same
// initial row whichever op, batch or thread creates it, so a lookup that only
// reads an initial row and a later find_or_insert that stores it agree.

class RowRng {
 public:
  explicit RowRng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {  // splitmix64: passes BigCrush, one add + Mix per draw
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in the open interval (0, 1).
  double Uniform() { return (static_cast<double>(Next() >> 11) + 0.5) * 0x1.0p-53; }
  // Standard normal with a 24-bit mantissa (ample for initial values): each
  // 64-bit draw feeds two samples. The common case (~99%) is inline.
  inline double Normal();
  // f(j, z_j) for n standard normals: as Normal() but both halves of each
  // 64-bit draw are used directly (a row draws ~30% faster).
  template <class F>
  void Normals(int64_t n, F&& f) {
    for (int64_t j = 0; j < n; j += 2) {
      const uint64_t w = Next();
      f(j, NormalOf(static_cast<uint32_t>(w)));
      if (j + 1 < n) f(j + 1, NormalOf(static_cast<uint32_t>(w >> 32)));
    }
  }

 private:
  inline double NormalOf(uint32_t u);  // the ziggurat on 32 random bits
  double NormalSlow(uint32_t u);
  uint32_t Half() {
    if (have_half_) {
      have_half_ = false;
      return half_;
    }
    const uint64_t u = Next();
    half_ = static_cast<uint32_t>(u >> 32);
    have_half_ = true;
    return static_cast<uint32_t>(u);
  }
  uint64_t state_;
  uint32_t half_ = 0;
  bool have_half_ = false;
};

// Ziggurat tables (Marsaglia & Tsang 2000, 128 layers) for 25-bit signed
// magnitudes, built once.
struct ZigguratTables {
  int32_t kn[128];
  double wn[128];
  double fn[128];
  ZigguratTables() {
    const double m1 = 16777216.0;  // 2^24
    double dn = 3.442619855899, tn = dn;
    const double vn = 9.91256303526217e-3;
    const double q = vn / std::exp(-0.5 * dn * dn);
    kn[0] = static_cast<int32_t>((dn / q) * m1);
    kn[1] = 0;
    wn[0] = q / m1;
    wn[127] = dn / m1;
    fn[0] = 1.0;
    fn[127] = std::exp(-0.5 * dn * dn);
    for (int i = 126; i >= 1; --i) {
      dn = std::sqrt(-2.0 * std::log(vn / dn + std::exp(-0.5 * dn * dn)));
      kn[i + 1] = static_cast<int32_t>((dn / tn) * m1);
      tn = dn;
      fn[i] = std::exp(-0.5 * dn * dn);
      wn[i] = dn / m1;
    }
  }
};

inline const ZigguratTables kZig{};  // one instance, built when the library loads

inline double RowRng::Normal() { return NormalOf(Half()); }

inline double RowRng::NormalOf(uint32_t u) {
  // Layer index and magnitude come from disjoint bits (the original generator
  // reused low bits for both, a known weakness).
  const int iz = static_cast<int>(u & 127);
  const int32_t hz = static_cast<int32_t>(u) >> 7;  // signed, |hz| <= 2^24
  const int32_t ahz = hz < 0 ? -hz : hz;
  if (ahz < kZig.kn[iz]) return hz * kZig.wn[iz];
  return NormalSlow(u);
}

__attribute__((noinline)) inline double RowRng::NormalSlow(uint32_t u) {
  const ZigguratTables& z = kZig;
  const double r = 3.442619855899;
  for (bool first = true;; first = false) {
    if (!first) u = Half();
    const int iz = static_cast<int>(u & 127);
    const int32_t hz = static_cast<int32_t>(u) >> 7;
    const int32_t ahz = hz < 0 ? -hz : hz;
    if (ahz < z.kn[iz]) return hz * z.wn[iz];
    if (iz == 0) {  // tail beyond r
      double x, y;
      do {
        x = -std::log(Uniform()) / r;
        y = -std::log(Uniform());
      } while (y + y < x * x);
      return hz > 0 ? r + x : -r - x;
    }
    const double x = hz * z.wn[iz];
    if (z.fn[iz] + Uniform() * (z.fn[iz - 1] - z.fn[iz]) < std::exp(-0.5 * x * x)) return x;
  }
}

// --------------------------------------------------------- slab memory --
// Large buffers come straight from the kernel: growth by mremap never copies
// or doubles resident memory, untouched capacity costs no RSS, and freeing
// returns pages to the OS instead of fragmenting the malloc heap.

constexpr size_t kMmapMin = size_t{64} << 10;

// `populate`: fault every page in now, in one call (for buffers written whole
// right away: one page fault each would cost far more on a VM).
inline void* BigAlloc(size_t bytes, bool populate = false) {
  if (bytes == 0) return nullptr;
#if defined(__linux__)
  if (bytes >= kMmapMin) {
    const int flags = MAP_PRIVATE | MAP_ANONYMOUS | (populate ? MAP_POPULATE : 0);
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    return p;
  }
#endif
  // Cache-line aligned, so an index group never straddles two lines.
  void* p = nullptr;
  return posix_memalign(&p, 64, bytes) == 0 ? p : nullptr;
}

inline void BigFree(void* p, size_t bytes) {
  if (p == nullptr) return;
#if defined(__linux__)
  if (bytes >= kMmapMin) {
    munmap(p, bytes);
    return;
  }
#endif
  (void)bytes;
  std::free(p);
}

// Faults in the pages of [p, p + bytes) of a BigAlloc buffer that are about to
// be written, in one call instead of a fault per page. Best effort: a kernel
// without MADV_POPULATE_WRITE (< 5.14) just takes the faults later.
inline void Prefault(char* p, size_t bytes) {
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
  const uintptr_t page = 4096;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + bytes + page - 1) & ~(page - 1);
  if (bytes >= page) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE);
#else
  (void)p;
  (void)bytes;
#endif
}

// Gives the whole pages inside [p, p + bytes) of a BigAlloc buffer back to the
// OS; they read as zeros when touched again. Best effort, like Prefault.
inline void ReleasePages(char* p, size_t bytes) {
#if defined(__linux__)
  const uintptr_t page = 4096;
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(p) + page - 1) & ~(page - 1);
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(page - 1);
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
#else
  (void)p;
  (void)bytes;
#endif
}

// Grows (or shrinks) a BigAlloc buffer keeping the first min(old, new) bytes.
// Returns nullptr on failure, leaving the old buffer valid.
inline void* BigRealloc(void* p, size_t old_bytes, size_t new_bytes) {
  if (p == nullptr) return BigAlloc(new_bytes);
#if defined(__linux__)
  if (old_bytes >= kMmapMin && new_bytes >= kMmapMin) {
    void* q = mremap(p, old_bytes, new_bytes, MREMAP_MAYMOVE);
    if (q == MAP_FAILED) return nullptr;
    return q;
  }
  if (old_bytes >= kMmapMin || new_bytes >= kMmapMin) {
    void* q = BigAlloc(new_bytes);
    if (q == nullptr) return nullptr;
    std::memcpy(q, p, old_bytes < new_bytes ? old_bytes : new_bytes);
    BigFree(p, old_bytes);
    return q;
  }
#endif
  (void)old_bytes;
  return std::realloc(p, new_bytes);
}

}  // namespace tfra_de

#endif  // TFRA_DE_CC_OPS_DE_UTIL_H_
