// ClusterResolver: TF_CONFIG as tf.distribute's TFConfigClusterResolver reads it (a chief task is
// worker 0, workers follow; ps and evaluator refused; errors naming the field), and which
// description wins when a launcher's variables are there too.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "tandem/tandem.h"

namespace td = tandem;

namespace {

/// Sets (or unsets, with nullopt) environment variables while alive; restores them after.
class ScopedEnvironment {
 public:
  explicit ScopedEnvironment(const std::map<std::string, std::optional<std::string>>& values) {
    for (const auto& [name, value] : values) {
      const char* old = std::getenv(name.c_str());
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
      set(name, value);
    }
  }
  ~ScopedEnvironment() {
    for (const auto& [name, value] : saved_) set(name, value);
  }

 private:
  static void set(const std::string& name, const std::optional<std::string>& value) {
    if (value) {
      ::setenv(name.c_str(), value->c_str(), 1);
    } else {
      ::unsetenv(name.c_str());
    }
  }
  std::map<std::string, std::optional<std::string>> saved_;
};

using Env = std::map<std::string, std::optional<std::string>>;

const Env kNoLauncher = {{"OMPI_COMM_WORLD_RANK", std::nullopt},
                         {"OMPI_COMM_WORLD_SIZE", std::nullopt},
                         {"PMI_RANK", std::nullopt},
                         {"PMI_SIZE", std::nullopt},
                         {"SLURM_PROCID", std::nullopt},
                         {"SLURM_NTASKS", std::nullopt},
                         {"TF_CONFIG", std::nullopt}};

}  // namespace

TEST_CASE("TF_CONFIG: workers, and a chief task that is worker 0", "[cpu][distribute][cluster]") {
  SECTION("workers only: worker i is rank i; local rank counts the workers on this host") {
    const td::ClusterSpec spec = td::ClusterResolver::from_tf_config(
        R"({"cluster": {"worker": ["10.0.0.2:12345", "10.0.0.3:12345", "10.0.0.3:12346"]},
            "task": {"type": "worker", "index": 2}})");
    CHECK(spec.source == "tf_config");
    CHECK(spec.size == 3);
    CHECK(spec.rank == 2);
    CHECK(!spec.is_chief());
    CHECK(spec.local_rank == 1);
    CHECK(spec.local_size == 2);
    CHECK(spec.addresses ==
          std::vector<std::string>{"10.0.0.2:12345", "10.0.0.3:12345", "10.0.0.3:12346"});
  }
  SECTION("a chief: it is worker 0 and the workers follow") {
    const std::string cluster =
        R"({"cluster": {"worker": ["w0:2222", "w1:2222"], "chief": ["c:2222"]}, )";
    const td::ClusterSpec chief =
        td::ClusterResolver::from_tf_config(cluster + R"("task": {"type": "chief", "index": 0}})");
    CHECK(chief.rank == 0);
    CHECK(chief.is_chief());
    CHECK(chief.size == 3);
    CHECK(chief.addresses == std::vector<std::string>{"c:2222", "w0:2222", "w1:2222"});
    const td::ClusterSpec worker =
        td::ClusterResolver::from_tf_config(cluster + R"("task": {"type": "worker", "index": 1}})");
    CHECK(worker.rank == 2);
    CHECK(worker.local_rank == 0);
    CHECK(worker.local_size == 1);
  }
  SECTION("other keys TensorFlow writes are ignored") {
    const td::ClusterSpec spec = td::ClusterResolver::from_tf_config(
        R"({"cluster": {"worker": ["localhost:1"]}, "task": {"type": "worker", "index": 0},
            "environment": "cloud", "rpc_layer": "grpc"})");
    CHECK(spec.size == 1);
  }
}

TEST_CASE("TF_CONFIG: what Tandem refuses, naming the field", "[cpu][distribute][cluster]") {
  auto refused = [](const std::string& tf_config, const std::string& expected) {
    INFO(tf_config);
    CHECK_THROWS_WITH(td::ClusterResolver::from_tf_config(tf_config), Catch::Contains(expected));
  };
  refused(R"({"cluster": {"worker": ["a:1", "b:1"], "ps": ["p:1"]},
              "task": {"type": "worker", "index": 0}})",
          "cluster has a \"ps\" job: Tandem has no parameter-server mode");
  refused(R"({"cluster": {"worker": ["a:1"], "evaluator": ["e:1"]},
              "task": {"type": "evaluator", "index": 0}})",
          "has no parameter-server mode");
  refused(R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "evaluator", "index": 0}})",
          "task.type is \"evaluator\"");
  refused(R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 2}})",
          "TF_CONFIG task.index = 2 is out of range: cluster.worker has 2 entries");
  refused(R"({"cluster": {"worker": ["a:1", "b:1", "a:1"]}, "task": {"type": "worker"}})",
          "TF_CONFIG cluster.worker[2] = \"a:1\" repeats cluster.worker[0]");
  refused(R"({"cluster": {"chief": ["a:1"], "worker": ["a:1"]}, "task": {"type": "chief"}})",
          "cluster.worker[0] = \"a:1\" repeats cluster.chief[0]");
  refused(R"({"cluster": {"worker": ["a:1", "b"]}, "task": {"type": "worker", "index": 0}})",
          "TF_CONFIG cluster.worker[1] = \"b\" is not \"host:port\"");
  refused(R"({"cluster": {"worker": ["a:99999"]}, "task": {"type": "worker", "index": 0}})",
          "cluster.worker[0] = \"a:99999\" is not \"host:port\"");
  refused(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0},})",
          "TF_CONFIG is not valid JSON");
  refused(R"({"task": {"type": "worker", "index": 0}})", "TF_CONFIG has no \"cluster\" object");
  refused(R"({"cluster": {"worker": ["a:1"]}})", "TF_CONFIG has no \"task\" object");
  refused(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": -1}})",
          "TF_CONFIG task.index must be a whole number >= 0");
  refused(R"({"cluster": {"chief": ["a:1", "b:1"]}, "task": {"type": "chief", "index": 0}})",
          "TF_CONFIG cluster.chief has 2 entries; at most one");
  refused(R"({"cluster": {"workers": ["a:1"]}, "task": {"type": "worker", "index": 0}})",
          "TF_CONFIG cluster.workers: unknown job");
}

TEST_CASE("TF_CONFIG: what TensorFlow refuses is refused, numbers checked before any cast",
          "[cpu][distribute][cluster]") {
  auto refused = [](const std::string& tf_config, const std::string& expected) {
    INFO(tf_config.substr(0, 300));
    CHECK_THROWS_WITH(td::ClusterResolver::from_tf_config(tf_config), Catch::Contains(expected));
  };
  const std::string cluster = R"({"cluster": {"worker": ["a:1", "b:1"]}, )";
  // Without an index a second process would take worker 0's place: a second chief.
  refused(cluster + R"("task": {"type": "worker"}})",
          "TF_CONFIG task.index is missing (which worker this process is)");
  refused(cluster + R"("task": {"type": "chief"}})", "TF_CONFIG task.index is missing");
  // Indices that a cast would have wrapped to 0 (worker 0, the chief).
  refused(cluster + R"("task": {"type": "worker", "index": 1e20}})",
          "TF_CONFIG task.index must be a whole number >= 0, got 1e+20");
  refused(cluster + R"("task": {"type": "worker", "index": 18446744073709551616}})",
          "TF_CONFIG task.index must be a whole number >= 0, got 1.8446744073709552e+19");
  refused(cluster + R"("task": {"type": "worker", "index": 1e400}})",
          "TF_CONFIG task.index must be a whole number >= 0, got a number too large to represent");
  refused(cluster + R"("task": {"type": "worker", "index": 0.5}})",
          "TF_CONFIG task.index must be a whole number >= 0, got 0.5");
  refused(cluster + R"("task": {"type": "worker", "index": "1"}})",
          "TF_CONFIG task.index must be a whole number >= 0, got the string \"1\"");
  refused(cluster + R"("task": {"type": "worker", "index": 4294967296}})", "got 4294967296");
  // Ports are digits alone; hosts hold no spaces, signs or control characters.
  refused(R"({"cluster": {"worker": ["a:+1"]}, "task": {"type": "worker", "index": 0}})",
          "TF_CONFIG cluster.worker[0] = \"a:+1\" is not \"host:port\"");
  refused(R"({"cluster": {"worker": ["a: 1"]}, "task": {"type": "worker", "index": 0}})",
          "TF_CONFIG cluster.worker[0] = \"a: 1\" is not \"host:port\"");
  refused(R"({"cluster": {"worker": ["a:123456"]}, "task": {"type": "worker", "index": 0}})",
          "TF_CONFIG cluster.worker[0] = \"a:123456\" is not \"host:port\"");
  refused(R"({"cluster": {"worker": ["a\u0000b:1"]}, "task": {"type": "worker", "index": 0}})",
          "TF_CONFIG cluster.worker[0] = \"a\\x00b:1\" is not \"host:port\"");
  refused(R"({"cluster": {"worker": ["a b:1"]}, "task": {"type": "worker", "index": 0}})",
          "\"a b:1\" is not \"host:port\"");
  refused(R"({"cluster": {"worker": ["[::1:1"]}, "task": {"type": "worker", "index": 0}})",
          "\"[::1:1\" is not \"host:port\"");
  // \u escapes read as the characters they are (not folded into ASCII look-alikes).
  refused(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "\u0177orker", "index": 0}})",
          "TF_CONFIG task.type = \"\u0177orker\" is not \"chief\" or \"worker\"");
  refused(
      R"({"cluster": {"worker": ["127.0.0.\u0131:1"]}, "task": {"type": "worker", "index": 0}})",
      "is not \"host:port\"");
  refused(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "\uZZZZ", "index": 0}})",
          "TF_CONFIG is not valid JSON (json: bad \\u escape");
  // Accepted: IPv6 in brackets, names with dashes and underscores.
  const td::ClusterSpec spec = td::ClusterResolver::from_tf_config(
      R"({"cluster": {"worker": ["[::1]:2222", "node-1.cluster_a:65535"]},
          "task": {"type": "worker", "index": 1}})");
  CHECK(spec.rank == 1);
  CHECK(spec.local_size == 1);
}

TEST_CASE("TF_CONFIG: nesting too deep for the reader is refused, not a stack overflow",
          "[cpu][distribute][cluster]") {
  std::string objects;
  for (int i = 0; i < 20000; ++i) objects += "{\"a\":";
  CHECK_THROWS_WITH(td::ClusterResolver::from_tf_config(objects),
                    Catch::Contains("TF_CONFIG is not valid JSON") &&
                        Catch::Contains("nested deeper than 64 levels") &&
                        Catch::Contains("(100000 characters)"));
  CHECK_THROWS_WITH(td::ClusterResolver::from_tf_config(std::string(130000, '[')),
                    Catch::Contains("nested deeper than 64 levels"));
  // 64 levels are fine (and then not a TF_CONFIG).
  std::string deep = std::string(63, '[') + std::string(63, ']');
  CHECK_THROWS_WITH(td::ClusterResolver::from_tf_config("{\"x\": " + deep + "}"),
                    Catch::Contains("TF_CONFIG has no \"cluster\" object"));
}

TEST_CASE("cluster resolution: a launcher's variables and TF_CONFIG",
          "[cpu][distribute][cluster]") {
  const std::string two_workers =
      R"({"cluster": {"worker": ["localhost:5000", "localhost:5001"]},
          "task": {"type": "worker", "index": 1}})";
  SECTION("TF_CONFIG alone describes the job") {
    ScopedEnvironment clean(kNoLauncher);
    ScopedEnvironment env(Env{{"TF_CONFIG", two_workers}});
    const td::ClusterSpec spec = td::ClusterResolver::from_environment();
    CHECK(spec.source == "tf_config");
    CHECK(spec.rank == 1);
    CHECK(spec.size == 2);
  }
  SECTION("a launcher alone describes the job") {
    ScopedEnvironment clean(kNoLauncher);
    ScopedEnvironment env(Env{{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "4"}});
    const td::ClusterSpec spec = td::ClusterResolver::from_environment();
    CHECK(spec.source == "open mpi");
    CHECK(spec.size == 4);
  }
  SECTION("TF_CONFIG in a process a launcher started alone: TF_CONFIG describes the job") {
    ScopedEnvironment clean(kNoLauncher);
    ScopedEnvironment env(Env{
        {"TF_CONFIG", two_workers}, {"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}});
    CHECK(td::ClusterResolver::from_environment().source == "tf_config");
  }
  SECTION("both describing a job of several processes: an error naming both") {
    ScopedEnvironment clean(kNoLauncher);
    ScopedEnvironment env(
        Env{{"TF_CONFIG", two_workers}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}});
    CHECK_THROWS_WITH(td::ClusterResolver::from_environment(),
                      Catch::Contains("TF_CONFIG describes 2 workers, and slurm started 2 "
                                      "processes") &&
                          Catch::Contains("unset TF_CONFIG under mpirun or srun"));
  }
  SECTION("an invalid TF_CONFIG raises from the environment too") {
    ScopedEnvironment clean(kNoLauncher);
    ScopedEnvironment env(Env{{"TF_CONFIG", "{not json"}});
    CHECK_THROWS_WITH(td::ClusterResolver::from_environment(),
                      Catch::Contains("TF_CONFIG is not valid JSON"));
  }
}
