// tandem-run's command line (tandem_run_options.h).
#include "tandem_run_options.h"

#include <cerrno>
#include <cstdlib>

#include "tandem/core/exit_status.h"

namespace tandem::run {

namespace {

bool parse_number(const std::string& text, double& out) {
  char* end = nullptr;
  errno = 0;
  out = std::strtod(text.c_str(), &end);
  return errno == 0 && end != text.c_str() && *end == '\0';
}

}  // namespace

int usage(FILE* out, int status) {
  std::fprintf(
      out,
      "usage: tandem-run --workers N [--min-workers M] [--max-restarts K] [--grace S]\n"
      "                  [--start-window S]\n"
      "                  [--rdzv HOST:PORT --nodes A:B --node-rank R [--join-timeout S]]\n"
      "                  -- PROGRAM ARGS...\n"
      "  --workers N        workers to start on this machine, each with its TF_CONFIG (the chief\n"
      "                     on a free loopback port)\n"
      "  --rdzv HOST:PORT   a job on several machines: they meet there (node 0 serves it; HOST\n"
      "                     an IPv4 address of node 0); workers get free ports on the address\n"
      "                     each machine reaches HOST from\n"
      "  --nodes A:B        machines in the job: a round starts when B have joined, or %.0f s\n"
      "                     after the A-th has (N: exactly N)\n"
      "  --node-rank R      this machine's place (0 .. B-1; its workers follow those of R-1)\n"
      "  --join-timeout S   seconds to wait for the rendezvous and for A machines (default 600)\n"
      "  --min-workers M    a worker that keeps failing to start is left out while at least M\n"
      "                     remain (default N: never)\n"
      "  --max-restarts K   restarts of the whole job after a worker failed (default 3); a\n"
      "                     preempted job (workers exiting %d) restarts without counting\n"
      "  --grace S          seconds between SIGTERM and SIGKILL when stopping workers (default "
      "10)\n"
      "  --start-window S   a failure within S seconds of the start is a failure to start "
      "(default 60)\n",
      kLastCallSeconds, tandem::kPreemptedExitStatus);
  return status;
}

std::optional<Options> parse(int argc, char** argv) {
  Options o;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "-h" || arg == "--help") {
      usage(stdout, 0);
      std::exit(0);
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "tandem-run: %s needs a value\n", arg.c_str());
      return std::nullopt;
    }
    const std::string value = argv[++i];
    if (arg == "--rdzv") {
      const size_t colon = value.rfind(':');
      double port = 0;
      if (colon == std::string::npos || colon == 0 ||
          !parse_number(value.substr(colon + 1), port) || port < 1 || port > 65535 ||
          port != static_cast<int>(port)) {
        std::fprintf(stderr, "tandem-run: --rdzv needs HOST:PORT, got \"%s\"\n", value.c_str());
        return std::nullopt;
      }
      o.rendezvous = value;
      o.rendezvous_host = value.substr(0, colon);
      o.rendezvous_port = static_cast<int>(port);
      continue;
    }
    if (arg == "--nodes") {
      const size_t colon = value.find(':');
      double low = 0, high = 0;
      const bool ok = colon == std::string::npos ? parse_number(value, low) && ((high = low), true)
                                                 : parse_number(value.substr(0, colon), low) &&
                                                       parse_number(value.substr(colon + 1), high);
      if (!ok || low < 1 || high < low || high > 4096 || low != static_cast<int>(low) ||
          high != static_cast<int>(high)) {
        std::fprintf(stderr, "tandem-run: --nodes needs A:B with 1 <= A <= B, got \"%s\"\n",
                     value.c_str());
        return std::nullopt;
      }
      o.min_nodes = static_cast<int>(low);
      o.max_nodes = static_cast<int>(high);
      continue;
    }
    double number = 0;
    if (!parse_number(value, number)) {
      std::fprintf(stderr, "tandem-run: %s needs a number, got \"%s\"\n", arg.c_str(),
                   value.c_str());
      return std::nullopt;
    }
    // Within what an int and a duration hold (and not NaN) before any cast.
    if (!(number >= 0 && number <= 1e6)) {
      std::fprintf(stderr, "tandem-run: %s %s is out of range [0, 1000000]\n", arg.c_str(),
                   value.c_str());
      return std::nullopt;
    }
    const bool whole = number == static_cast<int>(number);
    if (arg == "--workers" && whole && number >= 1) {
      o.workers = static_cast<int>(number);
    } else if (arg == "--min-workers" && whole && number >= 1) {
      o.min_workers = static_cast<int>(number);
    } else if (arg == "--max-restarts" && whole && number >= 0) {
      o.max_restarts = static_cast<int>(number);
    } else if (arg == "--grace" && number >= 0) {
      o.grace_seconds = number;
    } else if (arg == "--start-window" && number >= 0) {
      o.start_window_seconds = number;
    } else if (arg == "--node-rank" && whole) {
      o.node_rank = static_cast<int>(number);
    } else if (arg == "--join-timeout" && number > 0) {
      o.join_timeout_seconds = number;
    } else {
      std::fprintf(stderr, "tandem-run: unknown option or value out of range: %s %s\n", arg.c_str(),
                   value.c_str());
      return std::nullopt;
    }
  }
  for (; i < argc; ++i) o.command.emplace_back(argv[i]);
  if (o.workers == 0 || o.command.empty()) {
    std::fprintf(stderr, "tandem-run: %s\n",
                 o.workers == 0 ? "--workers N is required" : "no program after --");
    return std::nullopt;
  }
  const bool several = !o.rendezvous.empty() || o.max_nodes > 0 || o.node_rank >= 0;
  if (several && (o.rendezvous.empty() || o.max_nodes == 0 || o.node_rank < 0)) {
    std::fprintf(stderr,
                 "tandem-run: a job on several machines needs --rdzv, --nodes and "
                 "--node-rank together\n");
    return std::nullopt;
  }
  if (several && o.node_rank >= o.max_nodes) {
    std::fprintf(stderr, "tandem-run: --node-rank %d is not below --nodes' maximum %d\n",
                 o.node_rank, o.max_nodes);
    return std::nullopt;
  }
  if (several && o.min_workers != 0) {
    std::fprintf(stderr,
                 "tandem-run: --min-workers is for one machine; with --rdzv the job "
                 "shrinks by machines (--nodes A:B)\n");
    return std::nullopt;
  }
  if (o.min_workers == 0) o.min_workers = o.workers;
  if (o.min_workers > o.workers) {
    std::fprintf(stderr, "tandem-run: --min-workers %d is more than --workers %d\n", o.min_workers,
                 o.workers);
    return std::nullopt;
  }
  return o;
}

}  // namespace tandem::run
