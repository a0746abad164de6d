// Smoke tests of samples/shakespeare_gpt on a small text of its own (the Shakespeare corpus is
// not needed): a tiny GPT trains on 2 replicas, a run stopped midway (--stop-after) and resumed
// from its checkpoint ends with the uninterrupted run's validation loss to the last digit, text
// is generated from the newest checkpoint, and bad flags exit 2 naming the flag.
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "samples/run_program.h"

namespace fs = std::filesystem;

namespace {

const std::string kGpt =
    std::string(TANDEM_BINARY_DIR) + "/samples/shakespeare_gpt/shakespeare_gpt";

using Output = tandem::testing::Result;

Output run_gpt(const std::string& arguments) {
  return tandem::testing::run(kGpt + " " + arguments);
}

/// The text after "final validation loss: " up to the next space.
std::string final_loss(const std::string& output) {
  const std::string key = "final validation loss: ";
  const size_t at = output.rfind(key);
  REQUIRE(at != std::string::npos);
  const size_t begin = at + key.size();
  return output.substr(begin, output.find(' ', begin) - begin);
}

}  // namespace

TEST_CASE("shakespeare_gpt trains, resumes to the same bits after a stop, and generates",
          "[cpu][samples]") {
  const fs::path dir = fs::temp_directory_path() / ("tandem_gpt_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path text = dir / "text.txt";
  {
    std::ofstream out(text);
    for (int i = 0; i < 300; ++i)
      out << "To be, or not to be, that is the question " << i % 7 << ":\nWhether 'tis nobler "
          << (i % 3 ? "in the mind" : "to suffer") << ".\n";
  }
  const std::string common = "--data " + text.string() +
                             " --steps 12 --block 16 --layers 1 --heads 2 --embed 16 --batch 4"
                             " --warmup 2 --eval-interval 6 --eval-batches 2 --log-interval 6"
                             " --replicas 2 --seed 5";
  const Output whole = run_gpt(common + " --fresh --checkpoint-dir " + (dir / "whole").string());
  INFO(whole.output);
  REQUIRE(whole.exit_code == 0);
  CHECK(whole.output.find("2 replica(s)") != std::string::npos);
  CHECK(whole.output.find("update 12: validation loss") != std::string::npos);

  const std::string parts = common + " --checkpoint-dir " + (dir / "parts").string();
  const Output first = run_gpt(parts + " --fresh --stop-after 7");
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  CHECK(first.output.find("stopped after update 7") != std::string::npos);
  const Output rest = run_gpt(parts + " --generate 40 --prompt To");
  INFO(rest.output);
  REQUIRE(rest.exit_code == 0);
  CHECK(rest.output.find("at update 7 of 12") != std::string::npos);
  CHECK(final_loss(rest.output) == final_loss(whole.output));
  const size_t generated = rest.output.find("---- generated ----\nTo");
  REQUIRE(generated != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("shakespeare_gpt refuses bad flags naming them", "[cpu][samples]") {
  const Output unknown = run_gpt("--stesp 10");
  CHECK(unknown.exit_code == 2);
  CHECK(unknown.output.find("unknown flag --stesp") != std::string::npos);
  const Output bad = run_gpt("--steps ten");
  CHECK(bad.exit_code == 2);
  CHECK(bad.output.find("bad value 'ten' for --steps") != std::string::npos);
  const Output precision = run_gpt("--precision half");
  CHECK(precision.exit_code == 2);
  CHECK(precision.output.find("'half' for --precision") != std::string::npos);
  const Output missing = run_gpt("--data /nonexistent/corpus.txt --steps 1");
  CHECK(missing.exit_code == 1);
  CHECK(missing.output.find("cannot open \"/nonexistent/corpus.txt\"") != std::string::npos);
  const Output help = run_gpt("--help");
  CHECK(help.exit_code == 0);
  CHECK(help.output.find("--stop-after") != std::string::npos);
}
