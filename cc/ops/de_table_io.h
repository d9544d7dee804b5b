// Table<K, V>::SaveToFile / LoadFromFile: per-shard streaming files in the
// format of de_file.h. Included at the end of de_table_impl.h.
#ifndef TFRA_DE_CC_OPS_DE_TABLE_IO_H_
#define TFRA_DE_CC_OPS_DE_TABLE_IO_H_

namespace tfra_de {

template <class K, class V>
Status Table<K, V>::SaveToFile(const std::string& path, int group) {
  TF_RETURN_IF_ERROR(CheckGroup(group));
  TableFileWriter w;
  FileHeader h;
  h.key_dtype = cfg_.key_dtype;
  h.value_dtype = cfg_.value_dtype;
  h.dim = static_cast<uint64_t>(cfg_.dim);
  TF_RETURN_IF_ERROR(w.Open(path, h));
  uint64_t total = 0;
  std::vector<std::pair<uint32_t, std::string>> blocks;
  for (int si = 0; si < num_shards_; ++si) {
    // Each shard is a consistent snapshot: it is serialised under its read
    // lock (writers to other shards continue), then written unlocked.
    blocks.clear();
    {
      const Shard& s = shards_[si];
      std::shared_lock<std::shared_mutex> l(s.mu);
      std::string buf;
      uint32_t rows = 0;
      for (uint32_t row = 0; row < s.rows.high_water(); ++row) {
        const char* rec = Rec(s, row);
        if (Freq(rec) == 0) continue;
        KO::Encode(*reinterpret_cast<const KS*>(rec), &buf);
        buf.append(rec + layout_.stamp_off, 8);  // stamp + freq
        buf.append(rec + GroupOff(group), layout_.row_bytes);
        if (++rows == UINT32_MAX || buf.size() >= kBlockTargetBytes) {
          blocks.emplace_back(rows, std::move(buf));
          buf.clear();
          rows = 0;
        }
      }
      if (rows > 0) blocks.emplace_back(rows, std::move(buf));
    }
    for (const auto& blk : blocks) {
      TF_RETURN_IF_ERROR(w.WriteBlock(blk.first, blk.second));
      total += blk.first;
    }
  }
  return w.Finish(total);
}

template <class K, class V>
Status Table<K, V>::LoadFromFile(const std::string& path, int group, int64_t* loaded) {
  TF_RETURN_IF_ERROR(CheckGroup(group));
  TableFileReader r;
  FileHeader h;
  TF_RETURN_IF_ERROR(r.Open(path, &h));
  if (h.key_dtype != static_cast<uint32_t>(cfg_.key_dtype) ||
      h.value_dtype != static_cast<uint32_t>(cfg_.value_dtype) ||
      h.dim != static_cast<uint64_t>(cfg_.dim)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "load_from_file: '", path, "' holds ", TypeName(h.key_dtype), " keys -> ",
        TypeName(h.value_dtype), "[", h.dim, "] rows, but the table is ",
        tensorflow::DataTypeString(cfg_.key_dtype), " -> ",
        tensorflow::DataTypeString(cfg_.value_dtype), "[", cfg_.dim, "]"));
  }
  // Everything is staged in a fresh table and swapped in only after the
  // footer's row count checks out: a bad file never leaves a partial load.
  tensorflow::core::RefCountPtr<Table> staged(new Table(cfg_));  // freed by Unref
  TF_RETURN_IF_ERROR(staged->Init());
  std::string payload;
  uint64_t count = 0, total = 0;
  std::vector<V> row(cfg_.dim);
  for (;;) {
    uint32_t rows = 0;
    bool at_end = false;
    TF_RETURN_IF_ERROR(r.NextBlock(&rows, &payload, &at_end, &total));
    if (at_end) break;
    const char* p = payload.data();
    const char* end = p + payload.size();
    for (uint32_t j = 0; j < rows; ++j) {
      KIn key;
      if (!KO::Decode(&p, end, &key) || static_cast<size_t>(end - p) < 8 + layout_.row_bytes) {
        return absl::DataLossError(absl::StrCat("load_from_file: block in '", path,
                                                "' ends inside row ", j, " of ", rows));
      }
      uint32_t meta[2];
      std::memcpy(meta, p, 8);
      std::memcpy(row.data(), p + 8, layout_.row_bytes);
      p += 8 + layout_.row_bytes;
      TF_RETURN_IF_ERROR(staged->PutOne(key, row.data(), meta[0], std::max<uint32_t>(1, meta[1])));
    }
    if (p != end) {
      return absl::DataLossError(absl::StrCat("load_from_file: block in '", path, "' has ",
                                              end - p, " bytes after its ", rows, " rows"));
    }
    count += rows;
  }
  if (count != total) {
    return absl::DataLossError(absl::StrCat("load_from_file: '", path, "' footer says ", total,
                                            " rows but its blocks hold ", count));
  }
  {
    auto locks = LockAll();
    if (group == 0 && groups_.load() == 1) {
      for (int i = 0; i < num_shards_; ++i) SwapShard(&shards_[i], &staged->shards_[i]);
      *loaded = ShardSum();
      // The shards changed tables, so the counts follow them (`staged` is freed below).
      total_.store(*loaded, std::memory_order_relaxed);
      live_.store(*loaded, std::memory_order_relaxed);
      return absl::OkStatus();  // `staged` now holds the old content and frees it here
    }
  }
  // Records with slot groups: the rows (or one slot group) are imported, which
  // keeps the other groups of the keys that stay (see Import).
  HostSink sink(cfg_, 1);
  int64_t next = -1;
  TF_RETURN_IF_ERROR(staged->ExportAll(&sink, &next, 0));
  staged.reset();
  TF_RETURN_IF_ERROR(Import(nullptr, sink.keys, sink.values, sink.stamps, sink.freqs,
                            /*clear_first=*/true, group));
  *loaded = sink.keys.NumElements();
  return absl::OkStatus();
}

}  // namespace tfra_de

#endif  // TFRA_DE_CC_OPS_DE_TABLE_IO_H_
