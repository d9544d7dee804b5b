// The Redis Cluster backend: slot routing done here. The slot map comes from
// CLUSTER SLOTS (asked of any reachable node); each command goes to the master
// of its key's slot, pipelined per (node, lane) and the nodes in parallel. A
// MOVED reply (the slot moved: resharding, failover) refreshes the map and the
// command is sent again; ASK (a slot being migrated) sends it once to the
// named node after ASKING; TRYAGAIN / CLUSTERDOWN are retried a few times.
// None of these replies means the command ran, so a retry never applies a
// write twice.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "cc/redis/redis_backend.h"
#include "tensorflow/core/platform/errors.h"

namespace tfra_de {
namespace redis {
namespace {

constexpr int kSlots = 16384;
constexpr int kMaxRounds = 6;  // redirections / retries of one batch

// CRC-16/XMODEM, Redis Cluster's key hash.
struct Crc16Table {
  uint16_t t[256];
  Crc16Table() {
    for (int i = 0; i < 256; ++i) {
      uint16_t c = static_cast<uint16_t>(i << 8);
      for (int k = 0; k < 8; ++k) {
        c = (c & 0x8000) ? static_cast<uint16_t>((c << 1) ^ 0x1021) : static_cast<uint16_t>(c << 1);
      }
      t[i] = c;
    }
  }
};
const Crc16Table kCrc16;

int KeySlot(const char* p, size_t n) {
  // Only the first non-empty {...} of a key is hashed (its hash tag).
  size_t s = 0;
  while (s < n && p[s] != '{') ++s;
  if (s < n) {
    size_t e = s + 1;
    while (e < n && p[e] != '}') ++e;
    if (e < n && e > s + 1) {
      p += s + 1;
      n = e - s - 1;
    }
  }
  uint16_t crc = 0;
  for (size_t i = 0; i < n; ++i) {
    crc = static_cast<uint16_t>((crc << 8) ^ kCrc16.t[((crc >> 8) ^ static_cast<uint8_t>(p[i])) & 0xFF]);
  }
  return crc % kSlots;
}

bool StartsWith(const redisReply* r, const char* prefix) {
  const size_t n = std::strlen(prefix);
  return r->type == REDIS_REPLY_ERROR && r->len >= n && std::memcmp(r->str, prefix, n) == 0;
}

// "MOVED 3999 127.0.0.1:6381" / "ASK ..." -> ("127.0.0.1", 6381).
bool Target(const redisReply* r, std::string* host, int* port) {
  const std::string text(r->str, r->len);
  const size_t sp = text.rfind(' ');
  const size_t colon = text.rfind(':');
  if (sp == std::string::npos || colon == std::string::npos || colon < sp) return false;
  *host = text.substr(sp + 1, colon - sp - 1);
  try {
    *port = std::stoi(text.substr(colon + 1));
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

class Cluster : public Backend {
 public:
  explicit Cluster(const std::vector<ServerOptions>& seeds) : seeds_(seeds), slots_(kSlots, nullptr) {}

  std::string Name() const override {
    std::string names;
    for (const auto& s : seeds_) names += (names.empty() ? "" : ",") + s.Name();
    return "Redis Cluster " + names;
  }
  int PoolSize() const override { return std::max(seeds_[0].pool_size, 1); }

  Status Check() override { return Refresh(); }

  Status Run(const std::vector<Command>& cmds, const ReplyFn& on_reply) override {
    std::vector<size_t> pending(cmds.size());
    for (size_t i = 0; i < cmds.size(); ++i) pending[i] = i;
    if (stale_.load()) TF_RETURN_IF_ERROR(Refresh());
    Status last;
    for (int round = 0; round < kMaxRounds && !pending.empty(); ++round) {
      if (round > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20 * round));
      // Group by (node, lane): a key's writes keep their order on one connection.
      std::map<std::pair<Pool*, int>, std::vector<size_t>> groups;
      {
        std::lock_guard<std::mutex> l(mu_);
        for (size_t i : pending) {
          const Command& c = cmds[i];
          Pool* pool = slots_[KeySlot(c.argv[c.key_arg], c.len[c.key_arg])];
          if (pool == nullptr) {
            stale_ = true;
            return absl::UnavailableError(absl::StrCat(Name(), ": no node serves the slot of '", c.Key(),
                                                       "' (cluster down?)"));
          }
          groups[{pool, c.lane}].push_back(i);
        }
      }
      std::vector<Job> jobs;
      for (auto& g : groups) jobs.push_back(Job{g.first.first, std::move(g.second)});
      std::mutex redirect_mu;
      std::vector<size_t> again;
      std::vector<std::pair<size_t, std::string>> asks;  // (command, "host:port")
      bool moved = false;
      Status s = RunJobs(cmds, jobs, [&](size_t i, const redisReply* r) -> Status {
        if (r->type != REDIS_REPLY_ERROR) return on_reply(i, r);
        std::lock_guard<std::mutex> l(redirect_mu);
        std::string host;
        int port;
        if (StartsWith(r, "MOVED ")) {
          moved = true;
          again.push_back(i);
          return absl::OkStatus();
        }
        if (StartsWith(r, "ASK ") && Target(r, &host, &port)) {
          asks.emplace_back(i, host + ":" + std::to_string(port));
          return absl::OkStatus();
        }
        if (StartsWith(r, "TRYAGAIN") || StartsWith(r, "CLUSTERDOWN")) {
          last = ReplyError(Name(), cmds[i], r);
          again.push_back(i);
          return absl::OkStatus();
        }
        return ReplyError(Name(), cmds[i], r);
      });
      if (!s.ok()) {
        // A node that failed may have been replaced (failover): ask again next time.
        if (absl::IsUnavailable(s)) stale_ = true;
        return s;
      }
      if (!asks.empty()) TF_RETURN_IF_ERROR(RunAsks(cmds, asks, on_reply, &again));
      if (moved) TF_RETURN_IF_ERROR(Refresh());
      std::sort(again.begin(), again.end());  // back in batch order
      pending.swap(again);
    }
    if (!pending.empty()) {
      return absl::UnavailableError(absl::StrCat(Name(), ": ", pending.size(), " command(s) still redirected after ",
                                                 kMaxRounds, " rounds", last.ok() ? "" : ": ", last.message()));
    }
    return absl::OkStatus();
  }

 private:
  // Commands a migrating slot's owner answered ASK for: ASKING, then the
  // command, on the node named.
  Status RunAsks(const std::vector<Command>& cmds, const std::vector<std::pair<size_t, std::string>>& asks,
                 const ReplyFn& on_reply, std::vector<size_t>* again) {
    for (const auto& ask : asks) {
      std::vector<Command> pair(2);
      pair[0].Add("ASKING", 6);
      pair[0].key_arg = 0;
      pair[1] = cmds[ask.first];
      Pool* pool = PoolFor(ask.second);
      if (pool == nullptr) return absl::InternalError(absl::StrCat(Name(), ": bad ASK target ", ask.second));
      Status s = pool->RunPipelined(pair, {0, 1}, [&](size_t j, const redisReply* r) -> Status {
        if (j == 0) return absl::OkStatus();
        if (r->type == REDIS_REPLY_ERROR) {
          if (StartsWith(r, "MOVED ") || StartsWith(r, "ASK ") || StartsWith(r, "TRYAGAIN")) {
            again->push_back(ask.first);
            return absl::OkStatus();
          }
          return ReplyError(ask.second, cmds[ask.first], r);
        }
        return on_reply(ask.first, r);
      });
      TF_RETURN_IF_ERROR(s);
    }
    return absl::OkStatus();
  }

  // The pool of node "host:port", made on first use.
  Pool* PoolFor(const std::string& name) {
    std::lock_guard<std::mutex> l(mu_);
    return PoolForLocked(name);
  }
  Pool* PoolForLocked(const std::string& name) {
    auto it = pools_.find(name);
    if (it != pools_.end()) return it->second.get();
    const size_t colon = name.rfind(':');
    if (colon == std::string::npos) return nullptr;
    ServerOptions opt = seeds_[0];
    opt.host = name.substr(0, colon);
    try {
      opt.port = std::stoi(name.substr(colon + 1));
    } catch (const std::exception&) {
      return nullptr;
    }
    opt.cluster = true;
    auto& pool = pools_[name];
    pool.reset(new Pool(opt));
    return pool.get();
  }

  // Reads the slot map with CLUSTER SLOTS from the first node that answers:
  // the seeds, then every node known so far.
  Status Refresh() {
    std::vector<std::string> candidates;
    for (const auto& s : seeds_) candidates.push_back(s.Name());
    {
      std::lock_guard<std::mutex> l(mu_);
      for (const auto& p : pools_) candidates.push_back(p.first);
    }
    Status first_error;
    for (const std::string& name : candidates) {
      Pool* pool = PoolFor(name);
      if (pool == nullptr) continue;
      std::vector<Command> cmd(1);
      cmd[0].Add("CLUSTER", 7);
      cmd[0].Add("SLOTS", 5);
      cmd[0].key_arg = 1;
      std::vector<std::pair<std::pair<int, int>, std::string>> ranges;
      Status s = pool->RunPipelined(cmd, {0}, [&](size_t, const redisReply* r) -> Status {
        if (r->type == REDIS_REPLY_ERROR) {
          return absl::FailedPreconditionError(absl::StrCat(
              "Redis server ", name, " answered CLUSTER SLOTS with an error (not a cluster node? "
              "redis_connection_mode 0 needs Redis Cluster): ", Printable(r->str, r->len)));
        }
        if (r->type != REDIS_REPLY_ARRAY) return absl::InternalError("unexpected CLUSTER SLOTS reply");
        for (size_t k = 0; k < r->elements; ++k) {
          const redisReply* e = r->element[k];
          if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 || e->element[0]->type != REDIS_REPLY_INTEGER ||
              e->element[1]->type != REDIS_REPLY_INTEGER || e->element[2]->type != REDIS_REPLY_ARRAY ||
              e->element[2]->elements < 2 || e->element[2]->element[1]->type != REDIS_REPLY_INTEGER) {
            return absl::InternalError(absl::StrCat("unexpected CLUSTER SLOTS entry from ", name));
          }
          const redisReply* master = e->element[2];
          std::string host(master->element[0]->str ? master->element[0]->str : "", master->element[0]->len);
          // An empty or "?" address means "the node you asked".
          if (host.empty() || host == "?") host = name.substr(0, name.rfind(':'));
          ranges.push_back({{static_cast<int>(e->element[0]->integer), static_cast<int>(e->element[1]->integer)},
                            host + ":" + std::to_string(master->element[1]->integer)});
        }
        return absl::OkStatus();
      });
      if (!s.ok()) {
        if (first_error.ok()) first_error = s;
        if (absl::IsFailedPrecondition(s)) return s;  // a reachable server that is no cluster node
        continue;
      }
      std::lock_guard<std::mutex> l(mu_);
      std::fill(slots_.begin(), slots_.end(), nullptr);
      for (const auto& range : ranges) {
        Pool* p = PoolForLocked(range.second);
        for (int slot = std::max(range.first.first, 0); slot <= std::min(range.first.second, kSlots - 1); ++slot) {
          slots_[slot] = p;
        }
      }
      stale_ = false;
      return absl::OkStatus();
    }
    return first_error.ok() ? absl::UnavailableError(Name() + ": no node to ask for the slot map") : first_error;
  }

  const std::vector<ServerOptions> seeds_;
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<Pool>> pools_;  // never removed: Pool* stay valid
  std::vector<Pool*> slots_;
  std::atomic<bool> stale_{false};
};

}  // namespace

std::unique_ptr<Backend> MakeCluster(const std::vector<ServerOptions>& seeds) {
  if (seeds.empty()) return nullptr;
  return std::unique_ptr<Backend>(new Cluster(seeds));
}

}  // namespace redis
}  // namespace tfra_de
