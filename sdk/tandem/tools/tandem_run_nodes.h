// tandem-run on several machines (--rdzv HOST:PORT --nodes A:B --node-rank R): one tandem-run
// per machine, each starting its --workers N. They meet at a rendezvous that node 0 serves (a
// process of its own, ending with node 0's tandem-run) and that decides for the whole job:
//
//   - a round (an attempt) starts when B machines have joined, or kLastCallSeconds after the
//     A-th has joined; the machines' workers are numbered by node rank, each on a free
//     port of the address its machine reaches the rendezvous from, and get one job token;
//   - a failed worker, or a machine that goes away (its connection closes), stops the round:
//     every other machine stops its workers, and all of them join the next round, up to
//     --max-restarts times; a restarted machine (the same --node-rank) joins the next round;
//   - a round whose workers all saved and stopped (preempted) starts again without counting;
//   - the job's last line (finished or failed, restarts used, machines lost) is printed by
//     every machine, and each exits with the job's status.
//
// Protocol, one text line per message over TCP:
//   machine -> rendezvous:  JOIN <rank> <workers> <address> <port,port,...>
//                           FAILED <exit code> <what>   (a worker here failed, sent at once)
//                           ENDED <finished|preempted|failed|stopped>
//   rendezvous -> machine:  START <attempt> <token> <first worker> <host:port,host:port,...>
//                           STOP <why>                  (a worker elsewhere failed)
//                           EXIT <status> <last line>   REFUSE <why>
#pragma once

#include "tandem_run_options.h"

namespace tandem::run {

/// Runs this machine's part of the job; returns tandem-run's exit status.
int run_nodes(const Options& o);
/// The rendezvous on `listener` (tandem_run_rendezvous.cpp); returns when the job is over.
void serve_rendezvous(int listener, const Options& o);

}  // namespace tandem::run
