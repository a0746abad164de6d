// Optimizer: the base of SGD, Adam and AdamW. It owns the update counter (iterations), the
// slot variables (named "<slot>/<variable>", e.g. m/dense/kernel) and the learning rate, and
// applies one update from gradients that are already combined across replicas.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "tandem/autograd/variable.h"
#include "tandem/optim/gradient_sync.h"
#include "tandem/optim/parameter_layout.h"
#include "tandem/optim/schedules.h"
#include "tandem/tensor/tensor.h"

namespace tandem::optim {

/// Bytes one replica holds for training, as the profiler reports them (Optimizer::memory_of).
struct ReplicaMemory {
  /// The variables the optimizer updates: one replica's copy of each.
  int64_t parameters = 0;
  /// The summed gradients the replica's updates read (sharded: its own parts' only).
  int64_t gradients = 0;
  /// Its slots (sharded: its own parts') and gradient accumulators.
  int64_t optimizer_state = 0;
};

/// Options of the plain form of Optimizer::apply_gradients.
struct ApplyGradientsOptions {
  /// The gradients are already summed across the replicas (ctx.all_reduce): allowed inside
  /// strategy.run with several replicas (Keras's skip_gradients_aggregation).
  bool skip_gradients_aggregation = false;
};

/// An optimizer. Structure of one update (apply_gradients):
///   check the pairs -> clip by global norm (if set) -> learning rate at iterations() ->
///   update_step(gradients, variables, slots) per dtype of the variables -> iterations += 1.
/// That is everything that happens after gradients are combined, so the replica-context form
/// (apply_gradients(ctx, ...), with distribution) sums the gradients across the replicas through
/// `ctx` (a GradientSync: a ReplicaContext) and then calls the same code; the counter is itself
/// a variable, so each replica steps its own copy identically.
///
/// Gradient accumulation (gradient_accumulation_steps = N > 1, Keras 3's option of that name):
/// each call of apply_gradients is a micro-step. On micro-steps 1..N-1 each replica adds its
/// gradients to its own accumulators (one per trainable variable, replica-local) and nothing
/// else happens: no collective, no update, iterations() unchanged. On micro-step N the
/// accumulators are all-reduced (SUM, one batched call, or the gradient buckets that micro-step's
/// backward pass filled with accumulator + gradient: GradientSync::expect_micro_step), divided by
/// N, and the update above runs on that mean (clipping after the division); then the accumulators
/// are reset. The update therefore sees the mean of the N micro-step gradients, so each
/// micro-step's loss is divided by the micro-step's global batch (per-replica batch x replicas;
/// compute_average_loss's default): N micro-batches of B equal one batch of N x B. A variable is
/// updated at the boundary when its gradient is defined on micro-step N (as in Keras).
///
/// Wrappers (LossScaleOptimizer) are optimizers too, as in Keras 3: made around another one,
/// every call goes to the optimizer they wrap, which holds the slots and the counter
/// (innermost()), and that optimizer's updates run the wrapper's transform_gradients first, on
/// the combined gradients. A training loop therefore holds one Optimizer& whatever wraps it.
class Optimizer {
 public:
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// Keras identifier: "sgd", "adam", "adamw", "lion", "loss_scale_optimizer".
  const std::string& name() const { return name_; }

  /// The optimizer that holds the slots and the update counter: this one, or for a wrapper
  /// the one it wraps (followed to the end).
  const Optimizer& innermost() const { return inner_ != nullptr ? inner_->innermost() : *this; }
  /// \copydoc innermost() const
  Optimizer& innermost() { return inner_ != nullptr ? inner_->innermost() : *this; }

  /// The loss to differentiate: `loss` itself, or for a loss scale loss x the scale (Keras 3's
  /// optimizer.scale_loss). The gradients of the returned loss go to apply_gradients as they are.
  virtual Tensor scale_loss(const Tensor& loss) const;

  /// Creates the slot variables of `variables` (zeros of each variable's shape and dtype,
  /// through tandem::make_variable) unless they exist. apply_gradients does this lazily; call
  /// it inside strategy.scope() so that the slots are mirrored too.
  void build(const std::vector<Variable>& variables);

  /// One update of `variables` with `gradients` (one per variable, in order). A variable whose
  /// gradient is undefined is left unchanged (a warning is logged once); shapes and dtypes
  /// must match (the error names the variable). Increments iterations() by one (with gradient
  /// accumulation: accumulates, and updates on every N-th call). Inside strategy.run with more
  /// than one replica in sync it raises (each replica would update with its own gradients
  /// alone): use the replica-context form below, or, for gradients already summed across the
  /// replicas (ctx.all_reduce), say so with {.skip_gradients_aggregation = true}, as in Keras.
  /// In cross-replica context (outside run, or inside merge_call) it applies the same update
  /// to every replica's copies of mirrored variables (and of the slots and counters), as
  /// tf.distribute's strategy.extended.update does: the copies stay equal. With
  /// shard_optimizer_state across workers it raises on every worker (the owners of some
  /// variables are in other processes): update inside strategy.run.
  void apply_gradients(const std::vector<Tensor>& gradients, const std::vector<Variable>& variables,
                       ApplyGradientsOptions options = {});
  /// The replica-context form (inside strategy.run, `ctx` being the ReplicaContext): all-reduces
  /// (SUM) the gradients across replicas in one batched call, then runs the update above
  /// (clipping after the reduction) on this replica's copies, identically everywhere. With
  /// gradient accumulation, only micro-step N all-reduces (the accumulators). Under
  /// shard_optimizer_state, a reduce-scatter, the owners' updates and an all-gather instead.
  void apply_gradients(GradientSync& ctx, const std::vector<Tensor>& gradients,
                       const std::vector<Variable>& variables);

  /// Updates applied so far (Keras' optimizer.iterations).
  int64_t iterations() const;
  /// Sets the counter on every replica copy (checkpoint restore).
  void set_iterations(int64_t iterations);
  /// The counter as an int64 scalar variable named "iteration".
  const Variable& iterations_variable() const { return innermost().iterations_; }

  /// The learning rate the next update uses: learning_rate()(iterations()).
  double current_learning_rate() const;
  /// The learning rate: a constant or a schedule of iterations().
  const LearningRate& learning_rate() const { return innermost().learning_rate_; }
  /// Replaces the learning rate (a constant or a schedule); the next update uses it.
  void set_learning_rate(LearningRate learning_rate) {
    innermost().learning_rate_ = std::move(learning_rate);
  }
  /// The global norm gradients are clipped to before each update (unset: no clipping).
  const std::optional<double>& global_clipnorm() const { return innermost().global_clipnorm_; }

  /// N: one update every N calls of apply_gradients (1: every call, no accumulators).
  int gradient_accumulation_steps() const { return innermost().accumulation_steps_; }

  /// Optimizer-state sharding (the shard_optimizer_state option; ZeRO's stage): 0, every
  /// replica holds every slot; 1 and 2, the mirrored variables are laid out end to end and cut
  /// into one contiguous range of about equal bytes per replica (ParameterLayout, made at the
  /// first build or update from that call's variables); a range ends at a variable's start or
  /// inside a large variable on a block boundary, so a variable's state may be split into
  /// parts of several replicas. Each replica holds the slots of its own parts only (one copy
  /// each, on its device; a part of a variable has a 1-D slot), and the replica-context
  /// apply_gradients reduce-scatters the gradients so that each replica receives the sums of
  /// its own parts alone (GradientSync::sum_to_owners), updates them, and all-gathers the
  /// updated parts to every replica (GradientSync::gather_from_owners): together the traffic
  /// of one all-reduce, and each replica holds its own parts' summed gradients only. Where the
  /// transport's reduce-scatter would be its whole all-reduce (GradientSync::reduces_to_owners
  /// false: Gloo, NCCL, Open MPI beyond two workers, compressed gradients), the gradients are
  /// summed as unsharded (the same bits; every replica holds the sums) and only the update and
  /// the all-gather are sharded. Stages 1 and 2 run this same pipeline (stage 2's gradient
  /// saving comes with the reduce-scatter).
  /// What every replica must decide alike is summed across them: the global norm's terms for
  /// global_clipnorm (one per block of kNormBlock elements, so a split variable's terms are
  /// those of the whole), the loss scale's non-finite count (exact, as every other replica
  /// adds zero). With accumulation the accumulators stay whole per replica (the micro-steps add
  /// before the sum, as unsharded). Each element's update is the same arithmetic at every
  /// stage: training is bitwise that of stage 0. The gradient buckets are not used (the
  /// reduce-scatter runs after the backward pass). Checkpoints are unchanged (whole slots,
  /// assembled from their parts) and restore at any replica count and stage. In a multi-worker
  /// job the layout spans every worker's replicas (owners are global replica ids, alike on
  /// every worker); a worker holds the slots of its own replicas' parts only, and
  /// CheckpointManager::save gathers the others' to the chief.
  int shard_optimizer_state() const { return innermost().shard_stage_; }
  /// Under sharding, the replica that owns `variable`'s first part (holds its slots and updates
  /// it: its replica_id_in_sync_group, a global id across workers; slot_placements() has every
  /// part), else -1 (every replica does: stage 0, or a variable that is not mirrored).
  int owner_of(const Variable& variable) const;
  /// What replica `replica` (replica_id_in_sync_group) holds for the variables built or updated
  /// so far (the largest of them is what a device must have room for).
  ReplicaMemory memory_of(int replica) const;
  /// Micro-steps accumulated since the last update, in [0, N): 0 at an update boundary. Inside
  /// strategy.run, this replica's count; outside, replica 0's (all replicas count alike).
  int64_t micro_step() const;
  /// Sets the micro-step counter on every replica copy (checkpoint restore).
  void set_micro_step(int64_t micro_step);
  /// The gradient accumulators with the names of their variables ("dense/kernel"), in the
  /// order of slot_variables(); each has one replica-local copy per replica. Empty when N = 1.
  std::vector<std::pair<std::string, Variable>> accumulator_variables() const;

  /// Slot kinds per variable, in order: {"momentum"} for SGD with momentum, {"m", "v"} for
  /// Adam/AdamW, {} for plain SGD.
  const std::vector<std::string>& slot_names() const { return innermost().slot_names_; }
  /// Every slot variable with its name, in canonical order: variables in the order they were
  /// first built, and for each its slots in slot_names() order (m/dense/kernel,
  /// v/dense/kernel, m/dense/bias, ...), as Keras interleaves them. Sharded, a slot split into
  /// parts of several replicas, or held by another worker's replica, is listed undefined (its
  /// shape and dtype are its variable's; slot_placements() has the parts).
  std::vector<std::pair<std::string, Variable>> slot_variables() const;
  /// The slot `slot_name` of `variable` (undefined when it is split among replicas or another
  /// worker holds it); raises when it does not exist.
  Variable slot(const Variable& variable, const std::string& slot_name) const;
  /// A slot, or the part of one that one replica holds, with what a checkpoint of a sharded
  /// optimizer needs to find it.
  struct SlotPlacement {
    std::string name;   ///< as in slot_variables()
    Variable slot;      ///< undefined when another worker holds it
    Variable variable;  ///< the variable it belongs to (the whole slot's shape and dtype)
    int owner = -1;     ///< the replica holding it, -1 for every replica
    int64_t begin = 0;  ///< the elements of the flattened slot it holds: [begin, end); its
    int64_t end = 0;    ///< shape is the variable's when that is all of them, else [end - begin]
  };
  /// Every slot, in slot_variables() order, with its variable and owner; a slot split among
  /// replicas as one placement per part, in element order.
  std::vector<SlotPlacement> slot_placements() const;
  /// Restore: sets slot `name` (as in slot_variables()) from `value`, its whole value (the
  /// variable's shape): every copy of a mirrored slot, or the elements of each part held in this
  /// process. Returns false when no such slot exists.
  bool load_slot(const std::string& name, const Tensor& value);

  /// Hyper-parameters as Keras-style JSON (stored in checkpoints).
  virtual std::string config_json() const;

  /// Keras's exclude_from_weight_decay: `variables`, and every variable whose name contains
  /// one of `name_parts`, get no weight decay (AdamW's), as nanoGPT leaves biases and
  /// normalization gains undecayed. Calls add up; make them before training.
  void exclude_from_weight_decay(const std::vector<Variable>& variables,
                                 const std::vector<std::string>& name_parts = {});
  /// Whether `variable` gets this optimizer's weight decay (not excluded).
  bool use_weight_decay(const Variable& variable) const;

 protected:
  /// Inside update_step: whether its variables get weight decay (apply_gradients gives the
  /// excluded variables an update_step call of their own).
  static bool weight_decay_applies();
  /// For subclasses: `name` is the Keras name ("adam"), `slot_names` the slot kinds each
  /// variable gets at build; the rest are the options every optimizer has.
  Optimizer(std::string name, LearningRate learning_rate, std::optional<double> global_clipnorm,
            int gradient_accumulation_steps, int shard_optimizer_state,
            std::vector<std::string> slot_names);
  /// For wrappers: `name` is the Keras name ("loss_scale_optimizer"); every call goes to
  /// `inner`, which must outlive this object and be wrapped by no other, and whose updates run
  /// this object's transform_gradients first.
  Optimizer(std::string name, Optimizer& inner);

  /// A wrapper's step between the combined gradients and the update it wraps, run on every
  /// replica with the same gradients (summed across the replicas, and with accumulation
  /// divided by N): may replace them (a loss scale unscales them) or return false to skip the
  /// update (iterations() does not count it). Clipping comes after. Plain optimizers keep them.
  /// `shards` is null when every replica holds every gradient; under optimizer-state sharding
  /// the gradients are the shards (1-D parts) this replica holds, and a decision every replica
  /// must share is summed across them through shards->sum_of_shards.
  virtual bool transform_gradients(std::vector<Tensor>& gradients, GradientSync* shards);
  /// Whether non-finite gradients are expected now and then (a dynamic loss scale skips those
  /// updates), so that TANDEM_CHECK_NUMERICS lets them through to transform_gradients.
  virtual bool expects_non_finite_gradients() const { return false; }

  /// The whole math of one update of the variables of one dtype, in Keras' float32 operation
  /// order, in place on this replica's tensors: each of `variables` and its slots are updated
  /// from its gradient (gradients[i] belongs to variables[i]; slots[k][i] is its slot
  /// slot_names()[k]). `learning_rate` is already rounded to the variables' float precision
  /// (Keras casts it); `step` is the 1-based update number (iterations() + 1). One call takes
  /// all variables of a dtype, so that a GPU updates them in one kernel launch. A wrapper's is
  /// never called: the optimizer it wraps updates.
  virtual void update_step(std::span<const Tensor> gradients, std::span<Tensor> variables,
                           std::vector<std::vector<Tensor>>& slots, double learning_rate,
                           int64_t step) = 0;

  /// Moves every replica copy of a counter variable to the host.
  static void keep_on_host(Variable& counter);

  /// "learning_rate": ..., "global_clipnorm": ... entries for config_json.
  std::string base_config_json() const;

 private:
  /// A variable's slots, or those of the elements [begin, end) of it that one replica owns.
  struct Part {
    int owner = -1;  // the (global) replica holding the slots; -1: every replica
    int64_t begin = 0;
    int64_t end = 0;
    // Mirrored (owner -1), or one copy each (undefined when the owner is another worker's
    // replica), of the variable's shape when the part is all of it, else 1-D.
    std::vector<Variable> slots;
  };
  struct Entry {
    Variable variable;
    std::vector<Part> parts;  // in element order; one, of owner -1, unsharded
    Variable accumulator;     // defined when accumulation_steps_ > 1
  };
  /// Under sharding, lays out those of `variables` (mirrored) that have no owner yet and gives
  /// each its owner (ParameterLayout), before their entries are made.
  void assign_owners(const std::vector<Variable>& variables);
  /// The index among this process's copies of global replica `owner`; -1 when it is a replica
  /// of another worker.
  static int local_copy_of(int owner);
  /// Whether a sharded layout made now spans several workers (a multi-worker strategy lives).
  static bool shards_across_workers();
  /// Under sharding: every part of each variable whose gradient is present, in order.
  std::vector<GradientSync::Shard> shards_of(const std::vector<Variable>& variables,
                                             const std::vector<bool>& present);
  /// The replica-context update under sharding: the gradients (with accumulation, on the last
  /// micro-step, the accumulators) reduce-scattered to their owners, the owners' update, and
  /// the updated parts gathered to every replica.
  void apply_sharded(GradientSync& ctx, const std::vector<Tensor>& gradients,
                     const std::vector<Variable>& variables);
  /// One update under sharding: sums[k] is shard k's gradient (1-D), defined where this replica
  /// holds it (all, when `sync` is null: every replica computes the whole decision itself).
  /// The wrappers' transforms and clipping see every shard held, deciding alike through
  /// `sync`; then this replica's own shards are updated; iterations + 1. Returns false when a
  /// transform skipped the update.
  bool apply_shards(std::vector<Tensor> sums, const std::vector<GradientSync::Shard>& shards,
                    const std::vector<Variable>& variables, GradientSync* sync);
  /// The wrappers' transform_gradients, outermost first; false when one skips the update.
  bool run_transforms(std::vector<Tensor>& gradients, GradientSync* sync);
  /// What one update changes in one tensor: its gradient, its value and slots (this replica's
  /// tensors or views of them), and whether its variable gets weight decay.
  struct UpdateItem {
    Tensor gradient;
    Tensor value;
    std::vector<Tensor> slots;
    bool decay = true;
  };
  /// update_step over `items`, one call per dtype and weight decay (the update's scalars are
  /// rounded to the dtype), at the learning rate of iterations(); then iterations() + 1.
  void update_items(std::vector<UpdateItem> items);
  /// Under sharding, after an update from whole sums: the parts of the variables updated from
  /// `gradients` (defined) gathered from their owners to every replica.
  void gather_updated(GradientSync& ctx, const std::vector<Tensor>& gradients,
                      const std::vector<Variable>& variables);
  /// The global id of the replica the calling thread updates for.
  static int updating_replica();
  /// Zeroes this replica's accumulators and the micro-step counter (after an update).
  void reset_accumulators();
  /// The entry of `variable`, created (with its slots) when missing.
  Entry& entry_for(const Variable& variable);
  /// Raises unless gradients and variables pair up (count, shape, dtype) and at least one
  /// gradient is defined; warns once per variable without a gradient.
  void check_pairs(const std::vector<Tensor>& gradients, const std::vector<Variable>& variables);
  /// {field, value} pairs of what every worker must have alike: this optimizer's name and
  /// hyper-parameters, and each variable's name, shape and dtype.
  std::vector<std::pair<std::string, std::string>> describe_update(
      const std::vector<Variable>& variables) const;
  /// With TANDEM_CHECK_NUMERICS on, raises at the first gradient holding NaN or Inf, naming
  /// its variable, `replica` ("replica 1", or "" outside a strategy) and the step it was for.
  void check_numerics(const std::vector<Tensor>& gradients, const std::vector<Variable>& variables,
                      const std::string& replica) const;
  /// One update from gradients already combined (and checked): clip, update_step, iterations+1.
  /// Under sharding only the calling replica's own parts. Returns false when a wrapper's
  /// transform skipped the update.
  bool apply_update(const std::vector<Tensor>& gradients, const std::vector<Variable>& variables);
  /// apply_update, or with accumulation: add to the accumulators, updating on the N-th call (on
  /// the calling thread's copies).
  void update_or_accumulate(const std::vector<Tensor>& gradients,
                            const std::vector<Variable>& variables);
  /// Adds the defined gradients to this replica's accumulators and counts the micro-step.
  /// Returns the micro-steps done since the last update, this one included (N: the update's
  /// turn, the counter is left for finish_accumulation). `accumulated` holds, for each variable
  /// whose gradient is defined now, this replica's accumulator (undefined for the others).
  int64_t accumulate(const std::vector<Tensor>& gradients, const std::vector<Variable>& variables,
                     std::vector<Tensor>& accumulated);
  /// Divides the combined accumulators by N, applies the update and resets this replica's
  /// accumulators and micro-step counter.
  bool finish_accumulation(std::vector<Tensor> combined, const std::vector<Variable>& variables);

  std::string name_;
  LearningRate learning_rate_;
  std::optional<double> global_clipnorm_;
  std::vector<std::string> slot_names_;
  int accumulation_steps_;
  int shard_stage_ = 0;
  Variable iterations_;
  Variable micro_step_;  // defined when accumulation_steps_ > 1
  mutable std::mutex
      mutex_;  // guards entries_, index_, warned_, layout_parts_, layout_replicas_, agreed_
  std::vector<std::unique_ptr<Entry>> entries_;
  std::unordered_map<const void*, size_t> index_;
  std::unordered_set<const void*> warned_;
  // Under sharding: variable -> its parts and their owners.
  std::unordered_map<const void*, std::vector<ParameterLayout::Part>> layout_parts_;
  int layout_replicas_ = 0;         // under sharding: the replicas the layout spans (0: none yet)
  std::unordered_set<int> agreed_;  // replicas (in sync) that described this optimizer's updates
  std::unordered_set<const void*> no_decay_;  // exclude_from_weight_decay's variables
  std::vector<std::string> no_decay_names_;   // and name parts
  Optimizer* inner_ = nullptr;                // a wrapper's: the optimizer every call goes to
  Optimizer* wrapper_ = nullptr;  // the wrapper around this one, whose transform runs first
};

}  // namespace tandem::optim
