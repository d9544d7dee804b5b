// Where a table's commands go: one standalone server, or a Redis Cluster whose
// slots are routed here (CLUSTER SLOTS, MOVED / ASK redirections).
#ifndef TFRA_DE_CC_REDIS_REDIS_BACKEND_H_
#define TFRA_DE_CC_REDIS_REDIS_BACKEND_H_

#include <memory>
#include <string>
#include <vector>

#include "cc/redis/redis_conn.h"

namespace tfra_de {
namespace redis {

class Backend {
 public:
  virtual ~Backend() = default;
  // Connects once: a wrong address, password or db fails here.
  virtual Status Check() = 0;
  // Runs every command once and calls on_reply(i, reply) with its final reply
  // (never an error reply: those become the returned error, after every other
  // reply was read). Commands of one lane keep their order on one connection:
  // writes of a key (always in one lane) apply in the order given.
  virtual Status Run(const std::vector<Command>& cmds, const ReplyFn& on_reply) = 0;
  // "127.0.0.1:6379", or "Redis Cluster 127.0.0.1:7000,...": for error messages.
  virtual std::string Name() const = 0;
  virtual int PoolSize() const = 0;
};

// One pipelined run: commands `order` (indices into a batch) on a connection of `pool`.
struct Job {
  Pool* pool;
  std::vector<size_t> order;
};

// Runs the jobs in parallel (one thread each but the first, which runs here)
// and returns the first error. Each job's wait is bounded by its connection's
// timeouts, so this is bounded too.
Status RunJobs(const std::vector<Command>& cmds, const std::vector<Job>& jobs, const ReplyFn& on_reply);

// Runs a batch on one server's pool, its lanes on parallel connections; error
// replies become errors naming `server`.
Status RunOnPool(Pool* pool, const std::string& server, const std::vector<Command>& cmds,
                 const ReplyFn& on_reply);

std::unique_ptr<Backend> MakeStandalone(const ServerOptions& opt);
// Sentinel mode: the master named `master_name` is asked of the sentinels (when
// the table is created and again after its connection failed: a failover), and
// then used as a standalone server with `master`'s credentials and db.
std::unique_ptr<Backend> MakeSentinel(const std::vector<ServerOptions>& sentinels, const ServerOptions& master,
                                      const std::string& master_name);
// `seeds`: the configured nodes; any reachable one gives the slot map.
std::unique_ptr<Backend> MakeCluster(const std::vector<ServerOptions>& seeds);

}  // namespace redis
}  // namespace tfra_de

#endif  // TFRA_DE_CC_REDIS_REDIS_BACKEND_H_
