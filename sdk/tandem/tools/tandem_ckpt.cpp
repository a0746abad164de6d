// tandem-ckpt: inspect Tandem checkpoints from the shell.
//   tandem-ckpt inspect FILE   format, step, variables (shape, dtype), optimizer, training state
//   tandem-ckpt verify FILE    checks that a checkpoint would restore: its structure, every
//                              dataset read back (every checksum) and every value possible
//   tandem-ckpt latest DIR     the newest checkpoint of a CheckpointManager directory that
//                              restores (every newer one skipped is named on stderr, with why)
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "tandem/checkpoint/checkpoint_manager.h"
#include "tandem/checkpoint/inspect.h"

namespace {

constexpr int kExitError = 1;  // the command failed (message on stderr)
constexpr int kExitUsage = 2;  // wrong arguments

int usage(std::ostream& out, int status) {
  out << "usage: tandem-ckpt inspect FILE   describe a checkpoint (ckpt-N.h5)\n"
         "       tandem-ckpt verify FILE    check that a checkpoint would restore (exit 0), or\n"
         "                                  say why not (exit 1)\n"
         "       tandem-ckpt latest DIR     print the newest checkpoint in DIR that restores\n";
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && (std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help"))
    return usage(std::cout, 0);
  if (argc != 3) return usage(std::cerr, kExitUsage);
  const std::string command = argv[1];
  const std::string target = argv[2];
  try {
    if (command == "inspect") {
      std::cout << tandem::inspect_checkpoint(target);
      return 0;
    }
    if (command == "verify") {
      const std::string why = tandem::verify_checkpoint(target);
      if (!why.empty()) {
        std::cerr << "tandem-ckpt: " << why << "\n";
        return kExitError;
      }
      std::cout << target
                << (tandem::checkpoint_has_checksums(target)
                        ? ": ok (every dataset read back and checked)\n"
                        : ": ok, without checksums (written before checkpoints carried them): "
                          "every dataset read back and its values checked\n");
      return 0;
    }
    if (command == "latest") {
      std::vector<std::string> skipped;
      const std::optional<std::string> latest = tandem::latest_checkpoint(target, &skipped);
      for (const std::string& why : skipped) std::cerr << "tandem-ckpt: skipped " << why << "\n";
      if (!latest) {
        std::cerr << "tandem-ckpt: no complete checkpoint in " << target << "\n";
        return kExitError;
      }
      std::cout << *latest << "\n";
      return 0;
    }
  } catch (const std::exception& e) {
    std::cerr << "tandem-ckpt: " << e.what() << "\n";
    return kExitError;
  }
  std::cerr << "tandem-ckpt: unknown command \"" << command << "\"\n";
  return usage(std::cerr, kExitUsage);
}
