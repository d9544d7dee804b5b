// Compaction: giving a shard's rows back after removals. The live rows at the
// top of its slab move into its lowest free rows (their index slots are
// repointed) and the pages above the new top go back to the OS. Without it a
// shard kept the rows of the most keys it ever held, and under a bound every
// shard kept more than its share. When a shard compacts is the table's
// decision (Table::MaybeCompact, de_table_core.h); how is CompactRows here.
//
// Chunked exports walk rows by position, so rows moving behind a cursor would
// be missed: ScanRegistry counts the exports begun at cursor 0 and still open,
// and no shard compacts while one is (de_table_io.h registers them).
#ifndef TFRA_DE_CC_OPS_DE_COMPACTION_H_
#define TFRA_DE_CC_OPS_DE_COMPACTION_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "de_index.h"
#include "de_slab.h"

namespace tfra_de {

// The table's open chunked exports (those begun at cursor 0), and when one
// last read a chunk.
class ScanRegistry {
 public:
  // A registered scan with no chunk read for this long counts as abandoned.
  static constexpr int64_t kLeaseNs = int64_t{300} * 1000 * 1000 * 1000;

  void Open() { open_.fetch_add(1); }
  void Touch() { seen_ns_.store(NowNs()); }
  void Close() {
    int64_t n = open_.load();
    while (n > 0 && !open_.compare_exchange_weak(n, n - 1)) {
    }
  }
  // Whether a registered scan is open; one idle for kLeaseNs counts as
  // abandoned (its next chunk then fails if its shard compacted).
  bool Active() {
    if (open_.load() <= 0) return false;
    if (NowNs() - seen_ns_.load() < kLeaseNs) return true;
    open_.store(0);
    return false;
  }

  static int64_t NowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch()).count();
  }

 private:
  std::atomic<int64_t> open_{0};
  std::atomic<int64_t> seen_ns_{0};
};

// Moves the live rows of one shard at or above `target` (>= its size) into its
// lowest free rows, repointing their index slots, and releases the pages past
// the new top. Returns false, moving nothing, when the free list is short of
// rows below `target`. The caller holds the shard exclusively and keeps none
// of its rows; chunked export cursors into it become stale (the table counts
// its compactions for them).
template <class KO>
bool CompactRows(SlotIndex& index, RowSlab& slab, const RecordLayout& layout, size_t target) {
  using KS = typename KO::Stored;
  const size_t rec_bytes = layout.rec_bytes;
  std::vector<uint32_t> holes;
  for (uint32_t r : slab.free_rows()) {
    if (r < target) holes.push_back(r);
  }
  size_t movers = 0;
  for (uint32_t row = static_cast<uint32_t>(target); row < slab.high_water(); ++row) {
    movers += layout.Freq(slab.Rec(row, rec_bytes)) != 0;
  }
  if (movers > holes.size()) return false;  // the free list is short of holes: keep all rows
  std::sort(holes.begin(), holes.end());
  size_t used = 0;
  for (uint32_t row = static_cast<uint32_t>(target); row < slab.high_water(); ++row) {
    char* rec = slab.Rec(row, rec_bytes);
    if (layout.Freq(rec) == 0) continue;
    const KS& k = *reinterpret_cast<const KS*>(rec);
    const uint64_t h = KO::HashStored(k);
    const int64_t slot = index.Probe(h, [&](uint32_t r) {
      return KO::EqStored(*reinterpret_cast<const KS*>(slab.Rec(r, rec_bytes)), k);
    });
    if (slot >= 0) {  // (a row no slot points at is unreachable: it is dropped)
      const uint32_t to = holes[used++];
      // A record moves as its bytes: a long key's heap block goes with it.
      std::memcpy(slab.Rec(to, rec_bytes), rec, rec_bytes);
      index.Repoint(slot, h, to);
    }
    layout.SetMeta(rec, 0, 0);  // rows past the top read as free when handed out again
  }
  slab.ShrinkTo(target, holes.begin() + used, holes.end(), rec_bytes);
  return true;
}

}  // namespace tfra_de

#endif  // TFRA_DE_CC_OPS_DE_COMPACTION_H_
