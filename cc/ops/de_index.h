// SlotIndex: one shard's hash index, mapping a key's hash to the row id of its
// record. Open addressing over groups of 8 uint32 slots (SlotGroup, de_util.h):
// a full slot holds a 7-bit hash tag and a 25-bit row id (0xFFFFFFFF: empty;
// 0xFFFFFFFE: deleted), so a probe is one cache miss. A key's first group is
// its hash scaled to the group count (any multiple of 8 slots); probing goes
// on group by group.
//
// The keys themselves live in the shard's records (de_slab.h), so the index
// never compares keys: a probe asks its caller whether a candidate row holds
// the key, and a rebuild asks the caller for every live (hash, row). That keeps
// this class free of the key type, the record layout and the locking, which
// belong to the table (de_table_core.h); the caller holds the shard's lock.
#ifndef TFRA_DE_CC_OPS_DE_INDEX_H_
#define TFRA_DE_CC_OPS_DE_INDEX_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "de_util.h"

namespace tfra_de {

class SlotIndex {
 public:
  // HomeMatch's answer when the key is certainly not in the index.
  static constexpr int64_t kAbsent = -2;

  size_t cap() const { return cap_; }  // slots; a multiple of kGroupWidth
  size_t bytes() const { return cap_ * 4; }
  uint32_t RowAt(int64_t slot) const { return slots_[slot] & kRowMask; }

  // The index group where a key with hash h is looked for first: bits 7-38 of
  // h (bits 0-6 are its tag, the top bits pick its shard) scaled to the group
  // count, which need not be a power of two. Probes go on group by group.
  static uint64_t HomeGroup(uint64_t h, size_t cap) {
    return (((h >> 7) & 0xFFFFFFFFu) * (cap / kGroupWidth)) >> 32;
  }

  // Slots for an index that holds `rows` keys below the 7/8 load limit.
  static size_t CapFor(size_t rows) {
    size_t cap = kGroupWidth;
    while (cap - cap / 8 < rows) cap *= 2;
    return cap;
  }

  // Prefetches the group where a key with hash h is looked for first.
  void PrefetchHome(uint64_t h) const {
    if (cap_ == 0) return;
    __builtin_prefetch(slots_ + HomeGroup(h, cap_) * kGroupWidth);
  }

  // The row of the first slot in a key's first group whose tag matches (-1:
  // none); the caller verifies the key. kAbsent: no tag matches and the group
  // has an empty slot, so the key is not in the index (as long as nobody
  // inserts before the caller looks).
  int64_t HomeMatch(uint64_t h) const {
    if (cap_ == 0) return kAbsent;
    const uint64_t g = HomeGroup(h, cap_);
    const SlotGroup grp(slots_ + g * kGroupWidth);
    const uint32_t m = grp.Match(TagOf(h));
    if (m == 0) return grp.MaskEmpty() != 0 ? kAbsent : -1;
    return slots_[g * kGroupWidth + LowestSlot(m)] & kRowMask;
  }

  // The slot of the key with hash h (-1: absent); is_key(row) says whether the
  // record at `row` holds the key.
  template <class IsKey>
  int64_t Probe(uint64_t h, IsKey&& is_key) const {
    if (cap_ == 0) return -1;
    const uint64_t groups = cap_ / kGroupWidth;
    const uint32_t tag = TagOf(h);
    uint64_t g = HomeGroup(h, cap_);
    for (uint64_t step = 1;; ++step) {
      const SlotGroup grp(slots_ + g * kGroupWidth);
      for (uint32_t m = grp.Match(tag); m != 0; m &= m - 1) {
        const size_t slot = g * kGroupWidth + LowestSlot(m);
        if (is_key(slots_[slot] & kRowMask)) return static_cast<int64_t>(slot);
      }
      if (grp.MaskEmpty() != 0 || step >= groups) return -1;
      g = g + 1 == groups ? 0 : g + 1;
    }
  }

  // The slot a new key with hash h takes: the first empty or deleted one on its
  // probe path (the index must have slots). Always inlined, as FirstNonFull
  // (below): they are the insert path's probe, and in a unit holding every
  // value type's table the compiler's inlining budget runs out before them.
  __attribute__((always_inline)) size_t InsertSlot(uint64_t h) const { return FirstNonFull(slots_, cap_, h); }

  // Whether filling `slot` would take the index past its 7/8 load limit: then
  // it is rebuilt first (Rebuild, at GrownCap) and the slot looked up again.
  bool MustGrow(size_t slot) const { return growth_left_ == 0 && slots_[slot] != kDeletedSlot; }

  // The size of that rebuild for `live` keys. Mostly tombstones: rebuild at the
  // same size; otherwise double -- or, in a bounded table, whose shards stop
  // growing near their share of the bound, grow to a load of 0.7 only (doubling
  // left their index at a load of 0.4-0.5, 6-8% of a dim-16 bound's bytes).
  size_t GrownCap(size_t live, bool bounded) const {
    size_t cap = cap_ * 2;
    if (live * 4 <= cap_ * 3) {
      cap = cap_;
    } else if (bounded) {
      cap = std::min(cap, (live * 10 / 7 / kGroupWidth + 1) * kGroupWidth);
    }
    return cap;
  }

  // Points `slot` (from InsertSlot) at `row`.
  void Fill(size_t slot, uint64_t h, uint32_t row) {
    if (slots_[slot] == kEmptySlot) --growth_left_;
    slots_[slot] = FullSlot(h, row);
  }

  // Points a full slot at another row of the same key (compaction moved it).
  void Repoint(int64_t slot, uint64_t h, uint32_t row) { slots_[slot] = FullSlot(h, row); }

  void Erase(int64_t slot) {
    // A group that still has an empty slot ends every probe that reaches it,
    // so no probe continues past it and the slot may become empty again.
    const size_t g = static_cast<size_t>(slot) / kGroupWidth * kGroupWidth;
    if (SlotGroup(slots_ + g).MaskEmpty() != 0) {
      slots_[slot] = kEmptySlot;
      ++growth_left_;
    } else {
      slots_[slot] = kDeletedSlot;
    }
  }

  // Replaces the index by one of `new_cap` slots holding `live` keys:
  // for_each_live(place) calls place(hash, row) for each of them. On failure
  // the index is left as it was.
  template <class ForEachLive>
  absl::Status Rebuild(size_t new_cap, size_t live, ForEachLive&& for_each_live) {
    uint32_t* nslots = static_cast<uint32_t*>(BigAlloc(new_cap * 4, /*populate=*/true));
    if (nslots == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot grow a table shard index to ", new_cap, " slots"));
    }
    std::memset(nslots, 0xFF, new_cap * 4);  // all kEmptySlot
    for_each_live([&](uint64_t h, uint32_t row) {
      nslots[FirstNonFull(nslots, new_cap, h)] = FullSlot(h, row);
    });
    BigFree(slots_, cap_ * 4);
    slots_ = nslots;
    cap_ = new_cap;
    growth_left_ = new_cap - new_cap / 8 - live;
    return absl::OkStatus();
  }

  void Free() {
    BigFree(slots_, cap_ * 4);
    slots_ = nullptr;
    cap_ = 0;
    growth_left_ = 0;
  }

  void Swap(SlotIndex& other) {
    std::swap(slots_, other.slots_);
    std::swap(cap_, other.cap_);
    std::swap(growth_left_, other.growth_left_);
  }

 private:
  __attribute__((always_inline)) static size_t FirstNonFull(const uint32_t* slots, size_t cap, uint64_t h) {
    const uint64_t groups = cap / kGroupWidth;
    uint64_t g = HomeGroup(h, cap);
    for (;;) {
      const uint32_t m = SlotGroup(slots + g * kGroupWidth).MaskEmptyOrDeleted();
      if (m != 0) return g * kGroupWidth + LowestSlot(m);
      g = g + 1 == groups ? 0 : g + 1;
    }
  }

  uint32_t* slots_ = nullptr;  // cap_ slots (see SlotGroup)
  size_t cap_ = 0;
  size_t growth_left_ = 0;     // empty slots that may still be filled
};

}  // namespace tfra_de

#endif  // TFRA_DE_CC_OPS_DE_INDEX_H_
