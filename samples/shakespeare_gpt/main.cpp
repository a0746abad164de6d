// shakespeare_gpt: a character-level GPT trained on Shakespeare's plays, data-parallel, by
// default nanoGPT's CPU recipe for shakespeare_char (4 layers, 4 heads, embedding 128, block 64,
// batch 12, AdamW 1e-3 with 100 warmup steps and cosine decay to 1e-4 over 2,000 steps, beta_2
// 0.99, weight decay 0.1 on matrices, gradient clipping at global norm 1.0, no dropout).
// Validation loss (the mean of --eval-batches batches of the held-out 10%) every
// --eval-interval steps and at the end; checkpoints that resume exactly (weights, AdamW,
// the data position, the tokenizer's vocabulary); and text generated from the newest
// checkpoint with --generate N. Run from the repository root; --help lists the flags. The corpus:
// scripts/get-shakespeare (or --data FILE for any text).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/flags.h"
#include "common/reporting.h"
#include "common/training.h"
#include "shakespeare_gpt/gpt.h"
#include "tandem/tandem.h"

namespace td = tandem;

namespace {

struct Options {
  std::string data = "data/shakespeare/shakespeare.txt";
  int64_t steps = 2000, batch = 12, block = 64, layers = 4, heads = 4, embed = 128;
  double dropout = 0.0, learning_rate = 1e-3, min_learning_rate = 1e-4, weight_decay = 0.1;
  double beta_2 = 0.99, grad_clip = 1.0;
  int64_t warmup = 100, eval_interval = 250, eval_batches = 20, log_interval = 50;
  int64_t stop_after = 0;  // 0: run to --steps
  std::optional<int> replicas;
  std::string precision = "float32";
  int accumulation = 1;
  std::string checkpoint_dir = "checkpoints/shakespeare_gpt";
  bool fresh = false;
  int64_t generate = 0;
  double temperature = 0.8;
  int64_t top_k = 200;
  uint64_t seed = 1337;
  std::string tensorboard, profile, prompt = "\n";
};

const char* kUsage = R"(usage: shakespeare_gpt [flags]
  --data FILE             text to train on (default data/shakespeare/shakespeare.txt;
                          scripts/get-shakespeare fetches it)
  --steps N               optimizer updates (default 2000)
  --batch N               global batch of windows per step, split across replicas (12)
  --block N               context length (64)
  --layers N --heads N --embed N    the model (4, 4, 128)
  --dropout R             (0)
  --learning-rate R       peak (1e-3)     --min-learning-rate R   after the decay (1e-4)
  --warmup N              linear warmup updates (100)
  --weight-decay R        AdamW's, on matrices only (0.1)
  --beta2 R               (0.99)          --grad-clip R   global norm, 0 for none (1.0)
  --eval-interval N       validation every N updates (250)
  --eval-batches N        batches in one validation (20)
  --log-interval N        a training line every N updates (50)
  --stop-after N          save and stop after update N (the schedule still spans --steps;
                          the next run resumes there)
  --replicas N            CPU replicas (default: the strategy's choice)
  --precision P           float32 | mixed_bfloat16 | mixed_float16
  --accumulation N        micro-steps per update (1)
  --checkpoint-dir DIR    (checkpoints/shakespeare_gpt)   --fresh   ignore existing checkpoints
  --generate N            after training, N characters from the newest checkpoint (0)
  --temperature R (0.8)   --top-k N (200)   --prompt TEXT ("\n")
  --seed N                (1337)
  --tensorboard DIR       --profile FILE
)";

Options parse(int argc, char** argv) {
  Options o;
  std::map<std::string, std::string*> text{{"--data", &o.data},
                                           {"--precision", &o.precision},
                                           {"--checkpoint-dir", &o.checkpoint_dir},
                                           {"--tensorboard", &o.tensorboard},
                                           {"--profile", &o.profile},
                                           {"--prompt", &o.prompt}};
  std::map<std::string, int64_t*> integers{{"--steps", &o.steps},
                                           {"--batch", &o.batch},
                                           {"--block", &o.block},
                                           {"--layers", &o.layers},
                                           {"--heads", &o.heads},
                                           {"--embed", &o.embed},
                                           {"--warmup", &o.warmup},
                                           {"--eval-interval", &o.eval_interval},
                                           {"--eval-batches", &o.eval_batches},
                                           {"--log-interval", &o.log_interval},
                                           {"--generate", &o.generate},
                                           {"--top-k", &o.top_k},
                                           {"--stop-after", &o.stop_after}};
  std::map<std::string, double*> reals{{"--dropout", &o.dropout},
                                       {"--learning-rate", &o.learning_rate},
                                       {"--min-learning-rate", &o.min_learning_rate},
                                       {"--weight-decay", &o.weight_decay},
                                       {"--beta2", &o.beta_2},
                                       {"--grad-clip", &o.grad_clip},
                                       {"--temperature", &o.temperature}};
  auto fail = [](const std::string& message) {
    std::cerr << "shakespeare_gpt: " << message << " (--help lists the flags)" << std::endl;
    std::exit(samples::kUsageExitCode);
  };
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::cout << kUsage;
      std::exit(EXIT_SUCCESS);
    }
    if (flag == "--fresh") {
      o.fresh = true;
      continue;
    }
    if (i + 1 >= argc) fail("flag " + flag + " needs a value");
    const std::string value = argv[++i];
    try {
      size_t used = 0;
      if (auto t = text.find(flag); t != text.end()) {
        *t->second = value;
      } else if (auto n = integers.find(flag); n != integers.end()) {
        *n->second = std::stoll(value, &used);
        if (used != value.size() || *n->second < 0) throw std::invalid_argument(value);
      } else if (auto r = reals.find(flag); r != reals.end()) {
        *r->second = std::stod(value, &used);
        if (used != value.size() || !std::isfinite(*r->second) || *r->second < 0)
          throw std::invalid_argument(value);
      } else if (flag == "--replicas") {
        o.replicas = std::stoi(value, &used);
        if (used != value.size() || *o.replicas < 1) throw std::invalid_argument(value);
      } else if (flag == "--accumulation") {
        o.accumulation = std::stoi(value, &used);
        if (used != value.size() || o.accumulation < 1) throw std::invalid_argument(value);
      } else if (flag == "--seed") {
        o.seed = std::stoull(value, &used);
        if (used != value.size()) throw std::invalid_argument(value);
      } else {
        fail("unknown flag " + flag);
      }
    } catch (const std::logic_error&) {
      fail("bad value '" + value + "' for " + flag);
    }
  }
  if (o.precision != "float32" && o.precision != "mixed_bfloat16" && o.precision != "mixed_float16")
    fail("bad value '" + o.precision + "' for --precision");
  if (o.batch < 1 || o.block < 1 || o.eval_batches < 1 || o.eval_interval < 1)
    fail("--batch, --block, --eval-batches and --eval-interval must be positive");
  if (o.dropout >= 1) fail("--dropout must be below 1");
  return o;
}

/// Token ids drawn from the model's last-position logits [1, V]: divided by the temperature,
/// cut to the top k, sampled from the softmax with `generator`.
int64_t sample_next(const td::Tensor& logits, double temperature, int64_t top_k,
                    td::Generator& generator) {
  std::vector<double> z = td::ops::cast(logits, td::DType::kFloat64).to_vector<double>();
  for (double& v : z) v /= std::max(temperature, 1e-6);
  if (top_k > 0 && top_k < static_cast<int64_t>(z.size())) {
    std::vector<double> sorted = z;
    std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(),
                     std::greater<double>());
    const double cut = sorted[static_cast<size_t>(top_k - 1)];
    for (double& v : z)
      if (v < cut) v = -INFINITY;
  }
  const double top = *std::max_element(z.begin(), z.end());
  double total = 0;
  for (double& v : z) total += (v = std::exp(v - top));
  double u = generator.next_double() * total;
  for (size_t i = 0; i < z.size(); ++i)
    if ((u -= z[i]) < 0) return static_cast<int64_t>(i);
  return static_cast<int64_t>(z.size() - 1);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  try {
    samples::Flags flags;  // what the samples' shared helpers read
    flags.replicas = o.replicas;
    flags.precision = o.precision;
    flags.tensorboard = o.tensorboard;
    flags.profile = o.profile;
    flags.accumulation_steps = o.accumulation;
    const std::unique_ptr<td::Strategy> strategy_owner = samples::make_strategy(flags);
    td::Strategy& strategy = *strategy_owner;
    samples::TensorBoardLog tensorboard(o.tensorboard);
    const int replicas = strategy.num_replicas_in_sync();
    TANDEM_CHECK(o.batch % strategy.num_workers() == 0, "--batch ", o.batch,
                 " must be a multiple of the ", strategy.num_workers(), " workers");

    // The corpus: 90% to train on, the rest held out (nanoGPT's split).
    const std::string corpus = td::data::read_text_file(o.data);
    td::text::CharTokenizer tokenizer = td::text::CharTokenizer::from_corpus(corpus);
    const td::Tensor tokens = tokenizer.encode(corpus);
    const int64_t split = static_cast<int64_t>(static_cast<double>(tokens.numel()) * 0.9);
    const td::Tensor train_tokens = tokens.slice(0, split);
    const td::Tensor val_tokens = tokens.slice(split, tokens.numel());
    std::cout << "corpus: " << o.data << ", " << corpus.size() << " characters, vocabulary "
              << tokenizer.vocabulary_size() << "; train " << split << " tokens, validation "
              << val_tokens.numel() << std::endl;

    // Every update's windows: steps x batch x accumulation, drawn from the seed; the validation
    // windows are fixed (the same batches at every evaluation).
    const int64_t windows = std::max<int64_t>(o.steps, 1) * o.batch * o.accumulation;
    td::data::DistributedDataset train =
        strategy.distribute_dataset(td::data::random_windows(train_tokens, o.block, windows, o.seed)
                                        .batch(o.batch)
                                        .prefetch(2));
    td::data::DistributedDataset val = strategy.distribute_dataset(
        td::data::random_windows(val_tokens, o.block, o.eval_batches * o.batch, o.seed + 1)
            .batch(o.batch));

    samples::set_precision(flags);
    auto scope = strategy.scope();
    td::nn::Module model = samples::gpt::make_gpt({.vocabulary = tokenizer.vocabulary_size(),
                                                   .block = o.block,
                                                   .layers = o.layers,
                                                   .heads = o.heads,
                                                   .embed = o.embed,
                                                   .dropout = o.dropout});
    model.set_seed(o.seed);
    model.build({o.block});
    const std::vector<td::Variable> variables = model.trainable_variables();
    const int64_t updates = std::max<int64_t>(o.steps, 1);
    // Linear warmup from 0 to the peak, then cosine decay to the minimum (nanoGPT's get_lr):
    // Keras's CosineDecay with warmup, alpha = min / peak.
    const td::optim::LearningRate rate(td::optim::schedules::CosineDecay(
        0.0, std::max<int64_t>(updates - o.warmup, 1), o.min_learning_rate / o.learning_rate,
        o.learning_rate, o.warmup));
    td::optim::AdamW optimizer(
        {.learning_rate = rate,
         .weight_decay = o.weight_decay,
         .beta_2 = o.beta_2,
         .global_clipnorm = o.grad_clip > 0 ? std::optional<double>(o.grad_clip) : std::nullopt,
         .gradient_accumulation_steps = o.accumulation});
    optimizer.exclude_from_weight_decay(samples::gpt::undecayed(model));
    optimizer.build(variables);
    std::optional<td::optim::LossScaleOptimizer> loss_scale;
    if (td::nn::global_policy().compute_dtype() == td::DType::kFloat16)
      loss_scale.emplace(optimizer);
    // What the step updates through: the loss scale when there is one, else AdamW itself.
    td::optim::Optimizer& update =
        loss_scale ? static_cast<td::optim::Optimizer&>(*loss_scale) : optimizer;
    // Made after the optimizer, so that it ends first (its last summary reads the optimizer).
    const std::unique_ptr<td::profile::Profiler> profiler =
        samples::make_profiler(flags, strategy, tensorboard, &update);
    std::cout << "model: " << o.layers << " layers, " << o.heads << " heads, embedding " << o.embed
              << ", block " << o.block << ", " << model.count_params() << " parameters; "
              << replicas << " replica(s), global batch " << o.batch << " x " << o.block
              << " tokens" << (o.accumulation > 1 ? ", accumulation " : "")
              << (o.accumulation > 1 ? std::to_string(o.accumulation) : "") << ", precision "
              << o.precision << std::endl;

    auto train_step = [&](td::ReplicaContext& ctx, const td::data::Batch& batch) {
      td::GradientTape tape;
      const td::Tensor losses =
          samples::gpt::sequence_losses(model(batch[0], /*training=*/true), batch[1]);
      const td::Tensor loss = td::compute_average_loss(losses, o.batch);
      update.apply_gradients(ctx, tape.gradient(update.scale_loss(loss), variables), variables);
      return loss;
    };
    auto eval_step = [&](td::ReplicaContext&, const td::data::Batch& batch) {
      return td::compute_average_loss(
          samples::gpt::sequence_losses(model(batch[0], /*training=*/false), batch[1]),
          o.batch * o.eval_batches);
    };
    auto validate = [&] {
      double total = 0;
      val.set_epoch(0);
      for (const auto& batch : val)
        total += strategy.reduce(td::ReduceOp::kSum, strategy.run(eval_step, batch)).item<float>();
      return total;
    };

    td::Checkpoint checkpoint({{"model", &model},
                               {"optimizer", &update},
                               {"train_data", &train},
                               {"tokenizer", &tokenizer}});
    td::CheckpointManager manager(checkpoint, o.checkpoint_dir,
                                  {.max_to_keep = 3, .strategy = &strategy});
    std::optional<std::string> restored;
    if (!o.fresh) restored = manager.restore_or_initialize();
    std::cout << (restored ? "resumed from " + *restored : std::string("starting fresh"))
              << " at update " << optimizer.iterations() << " of " << o.steps << std::endl;

    // TensorBoard's points wait for the save that covers them: a run stopped before it resumes
    // from the save before and logs those updates once, when it trains them again.
    struct Point {
      std::string tag;
      int64_t step = 0;
      double value = 0;
    };
    std::vector<Point> unsaved;
    const auto save_then_log = [&] {
      manager.save();
      if (tensorboard.writer()) {
        for (const Point& point : unsaved)
          tensorboard.writer()->scalar(point.tag, point.step, point.value);
        tensorboard.writer()->flush();
      }
      unsaved.clear();
    };
    // The profile of the updates since the last one, at the update count (saved by then).
    const auto log_profile = [&] {
      if (!profiler) return;
      profiler->end_epoch();
      tensorboard.mark_profile(profiler.get());
      tensorboard.set_epoch(optimizer.iterations());
      tensorboard.write_profile(profiler.get());
    };

    const samples::Stopwatch run_time;
    int64_t tokens_done = 0;
    samples::Stopwatch interval;
    int64_t interval_tokens = 0;
    double last_val = NAN;
    for (const auto& batch : train) {
      const int64_t update = optimizer.iterations();
      if (update >= o.steps) break;
      const float loss =
          strategy.reduce(td::ReduceOp::kSum, strategy.run(train_step, batch)).item<float>();
      const int64_t step_tokens = o.batch * o.block;
      tokens_done += step_tokens;
      interval_tokens += step_tokens;
      if (optimizer.micro_step() != 0) continue;  // mid-accumulation
      const int64_t done = optimizer.iterations();
      if (done % o.log_interval == 0 || done == o.steps) {
        const double tokens_per_second = static_cast<double>(interval_tokens) / interval.seconds();
        std::cout << "update " << done << ": loss " << std::fixed << std::setprecision(4) << loss
                  << ", lr " << std::setprecision(6) << optimizer.current_learning_rate() << ", "
                  << std::setprecision(0) << tokens_per_second << " tokens/s" << std::endl;
        unsaved.push_back({.tag = "train/loss", .step = done, .value = loss});
        unsaved.push_back(
            {.tag = "train/tokens_per_second", .step = done, .value = tokens_per_second});
        interval = samples::Stopwatch();
        interval_tokens = 0;
      }
      if (done % o.eval_interval == 0 || done == o.steps) {
        last_val = validate();
        std::cout << "update " << done << ": validation loss " << std::fixed << std::setprecision(4)
                  << last_val << std::endl;
        unsaved.push_back({.tag = "validation/loss", .step = done, .value = last_val});
        save_then_log();
        interval = samples::Stopwatch();  // the evaluation and the save are not training time
        interval_tokens = 0;
      }
      if (o.stop_after > 0 && done >= o.stop_after && done < o.steps) {
        if (done % o.eval_interval != 0) save_then_log();
        log_profile();
        std::cout << "stopped after update " << done << " (--stop-after); the next run resumes here"
                  << std::endl;
        return EXIT_SUCCESS;
      }
    }
    log_profile();
    if (std::isnan(last_val)) last_val = validate();
    // All the digits: a resumed run ends where an uninterrupted one does, bit for bit.
    std::cout << "final validation loss: " << std::defaultfloat << std::setprecision(9) << last_val
              << " after " << optimizer.iterations() << " updates; " << std::fixed
              << std::setprecision(1) << run_time.seconds() << " s, " << std::setprecision(0)
              << static_cast<double>(tokens_done) / std::max(run_time.seconds(), 1e-9)
              << " tokens/s overall" << std::endl;

    if (o.generate > 0 && strategy.is_chief()) {
      // From the newest checkpoint (what a later run would load), one sequence on this thread.
      if (const std::optional<std::string> newest = manager.latest_checkpoint())
        manager.restore(*newest);
      td::Generator generator(o.seed, 7);
      std::vector<int64_t> context = tokenizer.encode(o.prompt).to_vector<int64_t>();
      std::string text = o.prompt;
      for (int64_t i = 0; i < o.generate; ++i) {
        const int64_t begin = std::max<int64_t>(0, static_cast<int64_t>(context.size()) - o.block);
        std::vector<int64_t> window(context.begin() + begin, context.end());
        const int64_t t = static_cast<int64_t>(window.size());
        const td::Tensor logits =
            model(td::Tensor::from_vector(window, td::Shape{1, t}), /*training=*/false);
        const td::Tensor last = td::ops::slice(logits, 1, t - 1, t);
        const int64_t next = sample_next(last, o.temperature, o.top_k, generator);
        context.push_back(next);
        text += tokenizer.decode(td::Tensor::from_vector<int64_t>({next}));
      }
      std::cout << "---- generated ----\n" << text << "\n-------------------" << std::endl;
    }
    return EXIT_SUCCESS;
  } catch (const std::exception& error) {
    std::cerr << "shakespeare_gpt: " << error.what() << std::endl;
    return EXIT_FAILURE;
  }
}
