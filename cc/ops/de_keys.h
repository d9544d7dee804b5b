// How each key dtype is hashed, stored inside a table record and compared.
#ifndef TFRA_DE_CC_OPS_DE_KEYS_H_
#define TFRA_DE_CC_OPS_DE_KEYS_H_

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "de_file.h"
#include "de_util.h"
#include "tensorflow/core/platform/tstring.h"

namespace tfra_de {

// How a key type is hashed, stored in a record and compared. Records are moved
// by mremap/realloc when a slab grows, so a stored key must be relocatable
// with memcpy (std::string is not: its short-string pointer points into itself).
template <class K>
struct KeyOps {  // int32 / int64
  using In = K;
  using Stored = K;
  using Owned = K;  // a copy that outlives the shard lock
  static uint64_t Hash(K k) { return Mix64(static_cast<uint64_t>(static_cast<int64_t>(k))); }
  static uint64_t HashStored(const Stored& k) { return Hash(k); }
  static bool Eq(const Stored& s, K k) { return s == k; }
  static bool EqStored(const Stored& a, const Stored& b) { return a == b; }
  static void Construct(void* p, K k) { std::memcpy(p, &k, sizeof(K)); }
  static void Destroy(void*) {}
  static size_t HeapBytes(const Stored&) { return 0; }  // bytes a stored key holds off the record
  static Owned ToOwned(const Stored& s) { return s; }
  static void Export(const Stored& s, K* out) { *out = s; }
  static void ExportOwned(const Owned& s, K* out) { *out = s; }
  static void Encode(const Stored& s, std::string* buf) {
    buf->append(reinterpret_cast<const char*>(&s), sizeof(K));
  }
  static bool Decode(const char** p, const char* end, K* k) {
    if (end - *p < static_cast<ptrdiff_t>(sizeof(K))) return false;
    std::memcpy(k, *p, sizeof(K));
    *p += sizeof(K);
    return true;
  }
};

// A string key in a record: up to 20 bytes inline, longer ones on the heap.
// Plain bytes only (no self-pointers), so records can move freely.
struct StrKey {
  static constexpr uint32_t kInline = 20;
  uint32_t size;
  char buf[kInline];  // the bytes, or a char* to them when size > kInline
  const char* data() const {
    if (size <= kInline) return buf;
    const char* p;
    std::memcpy(&p, buf, sizeof(p));
    return p;
  }
};

template <>
struct KeyOps<tensorflow::tstring> {
  using In = tensorflow::tstring;
  using Stored = StrKey;
  using Owned = std::string;
  static uint64_t Hash(const In& k) { return HashBytes(k.data(), k.size()); }
  static uint64_t HashStored(const Stored& k) { return HashBytes(k.data(), k.size); }
  static bool Eq(const Stored& s, const In& k) {
    return s.size == k.size() && std::memcmp(s.data(), k.data(), k.size()) == 0;
  }
  static bool EqStored(const Stored& a, const Stored& b) {
    return a.size == b.size && std::memcmp(a.data(), b.data(), a.size) == 0;
  }
  static void Construct(void* p, const In& k) {
    if (k.size() > UINT32_MAX) throw std::length_error("string key longer than 4 GiB");
    StrKey* s = static_cast<StrKey*>(p);
    const uint32_t n = static_cast<uint32_t>(k.size());
    if (n <= StrKey::kInline) {
      std::memcpy(s->buf, k.data(), n);
    } else {
      char* heap = new char[n];  // may throw bad_alloc before *s is touched
      std::memcpy(heap, k.data(), n);
      std::memcpy(s->buf, &heap, sizeof(heap));
    }
    s->size = n;
  }
  static void Destroy(void* p) {
    StrKey* s = static_cast<StrKey*>(p);
    if (s->size > StrKey::kInline) delete[] s->data();
    s->size = 0;
  }
  static size_t HeapBytes(const Stored& s) { return s.size > StrKey::kInline ? s.size : 0; }
  static Owned ToOwned(const Stored& s) { return std::string(s.data(), s.size); }
  static void Export(const Stored& s, In* out) { out->assign(s.data(), s.size); }
  static void ExportOwned(const Owned& s, In* out) { out->assign(s.data(), s.size()); }
  static void Encode(const Stored& s, std::string* buf) {
    PutU32(buf, s.size);
    buf->append(s.data(), s.size);
  }
  static bool Decode(const char** p, const char* end, In* k) {
    if (end - *p < 4) return false;
    uint32_t n;
    std::memcpy(&n, *p, 4);
    *p += 4;
    if (static_cast<uint64_t>(end - *p) < n) return false;
    k->assign(*p, n);
    *p += n;
    return true;
  }
};

}  // namespace tfra_de

#endif  // TFRA_DE_CC_OPS_DE_KEYS_H_
