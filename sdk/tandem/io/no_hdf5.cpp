// The HDF5 wrapper of a build without HDF5 (a dispatch point: it reads TANDEM_WITH_HDF5). Opening
// or creating a file raises NotBuiltError saying how to get HDF5; no other call can be reached.
#include "tandem/io/internal/hdf5_file.h"

#if !TANDEM_WITH_HDF5

#include "tandem/core/error.h"

namespace tandem::h5 {

namespace {
[[noreturn]] void not_built() {
  throw NotBuiltError(
      "HDF5 checkpoints: Tandem was built without HDF5 (TANDEM_WITH_HDF5=0). Install "
      "libhdf5-dev (scripts/setup does) and re-run CMake; it sets TANDEM_WITH_HDF5=1 when it "
      "finds HDF5");
}
}  // namespace

Handle::~Handle() = default;
Handle& Handle::operator=(Handle&& other) noexcept {
  id_ = other.id_;
  other.id_ = -1;
  return *this;
}
void Handle::close() { id_ = -1; }

std::string Group::where(const std::string& name) const { return file_ + ":" + path_ + name; }
Group Group::create_group(const std::string&) const { not_built(); }
Group Group::open_group(const std::string&) const { not_built(); }
Group Group::require_group(const std::string&) const { not_built(); }
bool Group::exists(const std::string&) const { not_built(); }
std::string Group::object_id(const std::string&) const { not_built(); }
Group Group::child(Handle, const std::string&) const { not_built(); }
void Group::check_storage(const std::string&) const { not_built(); }
Handle Group::open_set(const std::string&) const { not_built(); }
std::vector<std::string> Group::children() const { not_built(); }
bool Group::is_dataset(const std::string&) const { not_built(); }
Dataset Group::open_dataset(const std::string&, std::string, std::string) const { not_built(); }
void Group::write_tensor(const std::string&, const Tensor&) const { not_built(); }
void Group::write_u64(const std::string&, const std::vector<uint64_t>&, const Shape&) const {
  not_built();
}
Tensor Group::read_tensor(const std::string&) const { not_built(); }
int64_t Group::read_scalar_int64(const std::string&) const { not_built(); }
double Group::read_scalar_float64(const std::string&) const { not_built(); }
bool Group::has_checksum(const std::string&) const { not_built(); }
void Group::remove(const std::string&) const { not_built(); }
std::vector<uint64_t> Group::read_u64(const std::string&) const { not_built(); }
Tensor Group::read_rows(const std::string&, int64_t, int64_t) const { not_built(); }
Shape Group::dataset_shape(const std::string&) const { not_built(); }
DType Group::dataset_dtype(const std::string&) const { not_built(); }
std::string Group::dataset_type_name(const std::string&) const { not_built(); }
void Group::write_attr(const std::string&, const std::string&) const { not_built(); }
void Group::write_attr(const std::string&, int64_t) const { not_built(); }
void Group::write_attr(const std::string&, const std::vector<std::string>&) const { not_built(); }
void Group::write_attr_fixed(const std::string&, const std::vector<std::string>&) const {
  not_built();
}
void Group::write_attr_of(const std::string&, const std::string&, const std::string&) const {
  not_built();
}
std::optional<std::string> Group::read_attr_string_of(const std::string&,
                                                      const std::string&) const {
  not_built();
}
bool Group::has_attr(const std::string&) const { not_built(); }
void Group::remove_attr(const std::string&) const { not_built(); }
std::string Group::read_attr_string(const std::string&) const { not_built(); }
int64_t Group::read_attr_int64(const std::string&) const { not_built(); }
std::vector<std::string> Group::read_attr_strings(const std::string&) const { not_built(); }

std::vector<uint64_t> Dataset::extents() const { not_built(); }
ElementType Dataset::element_type() const { not_built(); }
Layout Dataset::layout() const { not_built(); }
int Dataset::external_files() const { not_built(); }
uint64_t Dataset::stored_bytes() const { not_built(); }
bool Dataset::compressed() const { not_built(); }
uint64_t Dataset::file_bytes() const { not_built(); }
void Dataset::read_rows(int64_t, int64_t, const Shape&, DType, void*) const { not_built(); }

File::File(Handle handle, std::string path, Origin)
    : file_(std::move(handle)), path_(std::move(path)) {}
File::~File() = default;
File File::create(const std::string&) { not_built(); }
File File::open(const std::string&, Origin) { not_built(); }
File File::open_for_update(const std::string&) { not_built(); }
File File::open_as_found(const std::string&, const std::string&) { not_built(); }
void File::flush() const { not_built(); }
void File::set_origin(Origin) { not_built(); }
int File::superblock_version() const { not_built(); }
void File::close() { file_.close(); }

bool is_hdf5(const std::string&) { not_built(); }
void require_regular_file(const std::string&) { not_built(); }
void check_global_heaps(const std::string&) { not_built(); }

}  // namespace tandem::h5

#endif  // !TANDEM_WITH_HDF5
