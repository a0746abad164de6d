// MetricState (named float64 variables) and Metric's state handling: per replica, summed over
// the replicas and the workers on read.
#include "tandem/metrics/metric.h"

#include <set>

#include "tandem/core/error.h"
#include "tandem/core/spans.h"

namespace tandem::metrics {

namespace {

std::string names_of(const MetricState::Values& values) {
  std::string out;
  for (const auto& [name, v] : values) out += (out.empty() ? "" : ", ") + name;
  return out.empty() ? "none" : out;
}

}  // namespace

// ---- MetricState -------------------------------------------------------------------------------

MetricState::MetricState(const std::vector<MetricVariable>& variables) {
  for (const MetricVariable& v : variables)
    values_.emplace_back(v.name, std::vector<double>(static_cast<size_t>(v.shape.numel()), 0.0));
}

MetricState::MetricState(std::initializer_list<std::pair<std::string, std::vector<double>>> values)
    : values_(values) {}

const std::vector<double>& MetricState::at(std::string_view name) const {
  for (const auto& [n, v] : values_)
    if (n == name) return v;
  TANDEM_THROW("metric state: no variable \"", name, "\" (the state has ", names_of(values_), ")");
}

std::vector<double>& MetricState::at(std::string_view name) {
  return const_cast<std::vector<double>&>(std::as_const(*this).at(name));
}

double MetricState::scalar(std::string_view name) const {
  const std::vector<double>& v = at(name);
  TANDEM_CHECK(v.size() == 1, "metric state: variable \"", name, "\" has ", v.size(),
               " values, not one");
  return v[0];
}

bool MetricState::contains(std::string_view name) const {
  for (const auto& [n, v] : values_)
    if (n == name) return true;
  return false;
}

void MetricState::add(const MetricState& other) {
  TANDEM_CHECK(other.values_.size() == values_.size(), "metric state: adding a state of variables ",
               names_of(other.values_), " to one of ", names_of(values_));
  for (size_t i = 0; i < values_.size(); ++i) {
    auto& [name, mine] = values_[i];
    const auto& [other_name, theirs] = other.values_[i];
    TANDEM_CHECK(name == other_name && mine.size() == theirs.size(),
                 "metric state: adding variable \"", other_name, "\" (", theirs.size(),
                 " values) to \"", name, "\" (", mine.size(), " values)");
    for (size_t k = 0; k < mine.size(); ++k) mine[k] += theirs[k];
  }
}

std::vector<double> MetricState::flatten() const {
  std::vector<double> out;
  for (const auto& [name, v] : values_) out.insert(out.end(), v.begin(), v.end());
  return out;
}

void MetricState::unflatten(const std::vector<double>& flat) {
  size_t at = 0;
  for (auto& [name, v] : values_) {
    TANDEM_CHECK(at + v.size() <= flat.size(), "metric state: ", flat.size(),
                 " values for a state of more");
    for (double& x : v) x = flat[at++];
  }
  TANDEM_CHECK(at == flat.size(), "metric state: ", flat.size(), " values for a state of ", at);
}

// ---- Metric ------------------------------------------------------------------------------------

Metric::Metric(std::string name)
    : Metric(std::move(name), {{.name = "total"}, {.name = "count", .non_negative = true}}) {}

Metric::Metric(std::string name, std::vector<MetricVariable> variables)
    : name_(std::move(name)),
      variables_(std::move(variables)),
      states_([this](int) { return MetricState(variables_); }),
      workers_(worker_group()) {
  TANDEM_CHECK(!variables_.empty(), "metric \"", name_, "\": declares no state variables");
  std::set<std::string> seen;
  for (const MetricVariable& v : variables_) {
    TANDEM_CHECK(!v.name.empty() && v.name.find('/') == std::string::npos, "metric \"", name_,
                 "\": state variable name \"", v.name, "\" must be non-empty and without '/'");
    TANDEM_CHECK(seen.insert(v.name).second, "metric \"", name_, "\": state variable \"", v.name,
                 "\" is declared twice");
    TANDEM_CHECK(v.shape.numel() >= 1, "metric \"", name_, "\": state variable \"", v.name,
                 "\" has shape ", v.shape, " with no values");
  }
}

void Metric::check_outside_run(const char* what) const {
  // A replica thread (its track), or the caller's thread while strategy.run binds it to a
  // replica: either way other replicas may be adding to their states right now.
  const bool in_replica = profile::current_track().kind == profile::TrackKind::kReplica ||
                          current_replica_binding().num_replicas > 1;
  TANDEM_CHECK(!in_replica, "metric \"", name_, "\": ", what,
               " was called inside strategy.run, while replicas may be updating their states; ",
               "call it outside strategy.run", workers_ ? ", on every worker" : "",
               " (metrics are sync-on-read: update_state inside run, ", what,
               " after run returns)");
}

MetricState& Metric::replica_state() { return states_.local(); }

MetricState Metric::local_state() const {
  MetricState sum(variables_);
  states_.for_each([&](int, const MetricState& s) { sum.add(s); });
  return sum;
}

MetricState Metric::combined_state() const {
  check_outside_run("combined_state()");
  MetricState mine = local_state();
  if (!workers_) return mine;
  std::vector<double> values = mine.flatten();
  workers_->sum(values, "metric result (every worker reads its metrics together)");
  mine.unflatten(values);
  return mine;
}

double Metric::result() const {
  check_outside_run("result()");
  return compute(combined_state());
}

double Metric::local_result() const {
  check_outside_run("local_result()");
  return compute(local_state());
}

int Metric::num_workers() const { return workers_ ? workers_->num_workers() : 1; }

void Metric::reset_state() {
  check_outside_run("reset_state()");
  states_.clear();
}

void Metric::set_combined_state(const MetricState& state) {
  check_outside_run("set_combined_state()");
  TANDEM_CHECK(state.values().size() == variables_.size(), "metric \"", name_,
               "\": set_combined_state with ", state.values().size(), " variables, the metric has ",
               variables_.size());
  for (size_t i = 0; i < variables_.size(); ++i) {
    const auto& [name, values] = state.values()[i];
    TANDEM_CHECK(name == variables_[i].name &&
                     static_cast<int64_t>(values.size()) == variables_[i].shape.numel(),
                 "metric \"", name_, "\": set_combined_state gives variable \"", name, "\" ",
                 values.size(), " values where the metric has \"", variables_[i].name,
                 "\" of shape ", variables_[i].shape);
  }
  states_.clear();
  if (!workers_ || workers_->worker_index() == 0) states_.at(0) = state;
}

std::vector<MetricState> Metric::replica_states() const {
  check_outside_run("replica_states()");
  std::vector<MetricState> out;
  states_.for_each([&](int, const MetricState& s) { out.push_back(s); });
  return out;
}

}  // namespace tandem::metrics
