// The sentinel backend: the master's address comes from Redis Sentinel, asked
// again whenever the master's connection failed or it answered as a replica
// (READONLY), so a failover costs the ops that ran into it, not the table.
#include <memory>
#include <mutex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cc/redis/redis_backend.h"
#include "tensorflow/core/platform/errors.h"

namespace tfra_de {
namespace redis {
namespace {

class Sentinel : public Backend {
 public:
  Sentinel(std::vector<ServerOptions> sentinels, ServerOptions master, std::string master_name)
      : sentinels_(std::move(sentinels)), master_(std::move(master)), master_name_(std::move(master_name)) {}

  std::string Name() const override {
    std::lock_guard<std::mutex> l(mu_);
    return Describe();
  }
  int PoolSize() const override { return std::max(master_.pool_size, 1); }

  Status Check() override {
    std::shared_ptr<Pool> pool;
    TF_RETURN_IF_ERROR(Current(&pool));
    return pool->Check();
  }

  Status Run(const std::vector<Command>& cmds, const ReplyFn& on_reply) override {
    std::shared_ptr<Pool> pool;
    TF_RETURN_IF_ERROR(Current(&pool));
    const Status s = RunOnPool(pool.get(), Name(), cmds, on_reply);
    if (absl::IsUnavailable(s) || absl::StrContains(s.message(), "READONLY")) {
      std::lock_guard<std::mutex> l(mu_);
      stale_ = true;  // ask the sentinels again next time: a failover may be under way
    }
    return s;
  }

 private:
  std::string Describe() const {
    std::string names;
    for (const auto& s : sentinels_) names += (names.empty() ? "" : ",") + s.Name();
    return absl::StrCat("Redis master '", master_name_, "'", pool_ ? " at " + pool_->options().Name() : "",
                        " (sentinels ", names, ")");
  }

  // The master's pool, asking the sentinels when there is none yet or it failed.
  Status Current(std::shared_ptr<Pool>* out) {
    std::lock_guard<std::mutex> l(mu_);
    if (!pool_ || stale_) {
      std::string host;
      int port = 0;
      TF_RETURN_IF_ERROR(AskSentinels(&host, &port));
      if (!pool_ || pool_->options().host != host || pool_->options().port != port) {
        ServerOptions opt = master_;
        opt.host = host;
        opt.port = port;
        pool_ = std::make_shared<Pool>(opt);  // ops still on the old pool keep it alive
      }
      stale_ = false;
    }
    *out = pool_;
    return absl::OkStatus();
  }

  Status AskSentinels(std::string* host, int* port) {
    Status first_error;
    for (const ServerOptions& sentinel : sentinels_) {
      Context c;
      Status s = Connect(sentinel, &c);
      if (s.ok()) {
        SigpipeGuard guard;
        const char* argv[] = {"SENTINEL", "get-master-addr-by-name", master_name_.c_str()};
        const size_t len[] = {8, 23, master_name_.size()};
        redisReply* r = static_cast<redisReply*>(redisCommandArgv(c.get(), 3, argv, len));
        if (r == nullptr) {
          s = absl::UnavailableError(absl::StrCat("Redis sentinel ", sentinel.Name(), ": connection lost: ",
                                                  c->errstr));
        } else if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 && r->element[0]->type == REDIS_REPLY_STRING &&
                   r->element[1]->type == REDIS_REPLY_STRING) {
          *host = std::string(r->element[0]->str, r->element[0]->len);
          try {
            *port = std::stoi(std::string(r->element[1]->str, r->element[1]->len));
          } catch (const std::exception&) {
            *port = 0;
          }
          freeReplyObject(r);
          if (*port > 0) return absl::OkStatus();
          s = absl::InternalError(absl::StrCat("Redis sentinel ", sentinel.Name(), ": bad master address"));
        } else {
          const bool error = r->type == REDIS_REPLY_ERROR;
          const std::string text = error ? Printable(r->str, r->len) : "";
          freeReplyObject(r);
          s = error ? absl::FailedPreconditionError(absl::StrCat(
                          "Redis server ", sentinel.Name(), " answered SENTINEL with an error (not a sentinel? "
                          "redis_connection_mode 1 needs Redis Sentinel): ", text))
                    : absl::NotFoundError(absl::StrCat("Redis sentinel ", sentinel.Name(),
                                                       " knows no master named '", master_name_,
                                                       "' (redis_master_name)"));
        }
      }
      if (first_error.ok()) first_error = s;
    }
    return first_error;
  }

  const std::vector<ServerOptions> sentinels_;
  const ServerOptions master_;
  const std::string master_name_;
  mutable std::mutex mu_;
  std::shared_ptr<Pool> pool_;
  bool stale_ = false;
};

}  // namespace

std::unique_ptr<Backend> MakeSentinel(const std::vector<ServerOptions>& sentinels, const ServerOptions& master,
                                      const std::string& master_name) {
  if (sentinels.empty()) return nullptr;
  return std::unique_ptr<Backend>(new Sentinel(sentinels, master, master_name));
}

}  // namespace redis
}  // namespace tfra_de
