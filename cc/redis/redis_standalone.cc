// The standalone backend: one server, its commands split by lane over pooled
// connections that run in parallel (each lane pipelined on its own connection).
#include <algorithm>
#include <map>
#include <system_error>
#include <thread>

#include "absl/strings/str_cat.h"
#include "cc/redis/redis_backend.h"

namespace tfra_de {
namespace redis {

Status RunJobs(const std::vector<Command>& cmds, const std::vector<Job>& jobs, const ReplyFn& on_reply) {
  if (jobs.empty()) return absl::OkStatus();
  if (jobs.size() == 1) return jobs[0].pool->RunPipelined(cmds, jobs[0].order, on_reply);
  std::vector<Status> results(jobs.size());
  std::vector<std::thread> threads;
  for (size_t k = 1; k < jobs.size(); ++k) {
    auto run = [&cmds, &jobs, &results, &on_reply, k] {
      results[k] = jobs[k].pool->RunPipelined(cmds, jobs[k].order, on_reply);
    };
    try {
      threads.emplace_back(run);
    } catch (const std::system_error&) {
      run();  // no thread to be had: this job runs here, before the first
    }
  }
  results[0] = jobs[0].pool->RunPipelined(cmds, jobs[0].order, on_reply);
  for (auto& t : threads) t.join();
  for (const Status& s : results) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

Status RunOnPool(Pool* pool, const std::string& server, const std::vector<Command>& cmds,
                 const ReplyFn& on_reply) {
  std::map<int, std::vector<size_t>> lanes;
  for (size_t i = 0; i < cmds.size(); ++i) lanes[cmds[i].lane].push_back(i);
  std::vector<Job> jobs;
  for (auto& lane : lanes) jobs.push_back(Job{pool, std::move(lane.second)});
  return RunJobs(cmds, jobs, [&](size_t i, const redisReply* r) -> Status {
    if (r->type == REDIS_REPLY_ERROR) return ReplyError(server, cmds[i], r);
    return on_reply(i, r);
  });
}

namespace {

class Standalone : public Backend {
 public:
  explicit Standalone(const ServerOptions& opt) : pool_(opt) {}

  Status Check() override { return pool_.Check(); }
  std::string Name() const override { return pool_.options().Name(); }
  int PoolSize() const override { return std::max(pool_.options().pool_size, 1); }

  Status Run(const std::vector<Command>& cmds, const ReplyFn& on_reply) override {
    return RunOnPool(&pool_, Name(), cmds, on_reply);
  }

 private:
  Pool pool_;
};

}  // namespace

std::unique_ptr<Backend> MakeStandalone(const ServerOptions& opt) {
  return std::unique_ptr<Backend>(new Standalone(opt));
}

}  // namespace redis
}  // namespace tfra_de
