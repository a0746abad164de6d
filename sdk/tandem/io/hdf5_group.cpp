// The HDF5 wrapper's groups: finding, creating and listing links, and the attributes of groups
// and datasets (strings, string lists, int64). Datasets are in hdf5_dataset.cpp.
#include <algorithm>
#include <cstring>

#include "tandem/io/internal/hdf5_check.h"

namespace tandem::h5 {

using detail::silence_hdf5;

// Link creation that makes missing intermediate groups ("m/dense/kernel:0" creates m, m/dense).
Handle detail::intermediate_groups_lcpl() {
  Handle lcpl(TANDEM_H5_CHECK(H5Pcreate(H5P_LINK_CREATE), "link creation properties"));
  TANDEM_H5_CHECK(H5Pset_create_intermediate_group(lcpl.id(), 1), "link creation properties");
  return lcpl;
}

std::string Group::where(const std::string& name) const {
  return file_ + ":" + (path_ == "/" ? "" : path_) + "/" + name;
}

Group Group::child(Handle handle, const std::string& name) const {
  return Group(std::move(handle), file_, path_ == "/" ? "/" + name : path_ + "/" + name, origin_);
}

Group Group::create_group(const std::string& name) const {
  hid_t id =
      TANDEM_H5_CHECK(H5Gcreate2(handle_.id(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                      "creating group ", where(name));
  return child(Handle(id), name);
}

Group Group::open_group(const std::string& name) const {
  TANDEM_CHECK(exists(name), where(name), ": group not found");
  hid_t id = TANDEM_H5_CHECK(H5Gopen2(handle_.id(), name.c_str(), H5P_DEFAULT), "opening group ",
                             where(name));
  return child(Handle(id), name);
}

bool Group::exists(const std::string& name) const {
  silence_hdf5();
  // Check each component: H5Lexists fails (not false) when an intermediate link is missing. And
  // each must be a hard link before the next is looked up through it: HDF5 follows a soft link
  // anywhere in the file and an external link into another file (one on a FIFO would block).
  size_t start = 0;
  while (start <= name.size()) {
    const size_t slash = name.find('/', start);
    const std::string prefix = name.substr(0, slash);
    if (!prefix.empty()) {
      // The components before this one are hard links to groups (checked below), so a negative
      // answer is not "absent": the group holding the link cannot be read (a damaged object
      // header or link index). Raised, so that a reader never takes damage for a missing entry.
      const htri_t found = H5Lexists(handle_.id(), prefix.c_str(), H5P_DEFAULT);
      if (found < 0)
        TANDEM_THROW(where(prefix), ": the link cannot be read (", detail::hdf5_message(),
                     "); the file is damaged");
      if (found == 0) return false;
      H5L_info_t link{};
      TANDEM_H5_CHECK(H5Lget_info(handle_.id(), prefix.c_str(), &link, H5P_DEFAULT), "the link ",
                      where(prefix));
      if (link.type != H5L_TYPE_HARD) {
        std::string target;
        if (link.type == H5L_TYPE_SOFT || link.type == H5L_TYPE_EXTERNAL) {
          std::vector<char> value(std::min<size_t>(link.u.val_size, 4096) + 1, '\0');
          if (H5Lget_val(handle_.id(), prefix.c_str(), value.data(), value.size() - 1,
                         H5P_DEFAULT) >= 0) {
            if (link.type == H5L_TYPE_SOFT) {
              target = std::string(" to \"") + value.data() + "\"";
            } else {
              const char* file = nullptr;
              const char* object = nullptr;
              unsigned flags = 0;
              if (H5Lunpack_elink_val(value.data(), value.size() - 1, &flags, &file, &object) >= 0)
                target = std::string(" to \"") + (object ? object : "") + "\" in \"" +
                         (file ? file : "") + "\"";
            }
          }
          H5Eclear2(H5E_DEFAULT);
        }
        TANDEM_THROW(where(prefix), " is ",
                     link.type == H5L_TYPE_SOFT       ? "a soft link"
                     : link.type == H5L_TYPE_EXTERNAL ? "an external link"
                                                      : "a user-defined link",
                     target, ", which is not followed: files Tandem reads hold hard links only");
      }
      // A link below a dataset does not exist (HDF5 would fail to look it up).
      if (slash != std::string::npos) {
        Handle object(TANDEM_H5_CHECK(H5Oopen(handle_.id(), prefix.c_str(), H5P_DEFAULT),
                                      "opening ", where(prefix)));
        if (H5Iget_type(object.id()) != H5I_GROUP) return false;
      }
    }
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return true;
}

std::string Group::object_id(const std::string& name) const {
  TANDEM_CHECK(name == "." || exists(name), where(name), ": not found");
#if H5_VERSION_GE(1, 12, 0)
  H5O_info2_t info{};
  TANDEM_H5_CHECK(
      H5Oget_info_by_name3(handle_.id(), name.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT),
      "the object ", where(name));
  char* text = nullptr;
  TANDEM_H5_CHECK(H5Otoken_to_str(handle_.id(), &info.token, &text), "the object ", where(name));
  const std::string id = text ? text : "";
  H5free_memory(text);
  return id;
#else
  H5O_info_t info{};
  TANDEM_H5_CHECK(
      H5Oget_info_by_name2(handle_.id(), name.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT),
      "the object ", where(name));
  return std::to_string(info.addr);
#endif
}

Group Group::require_group(const std::string& name) const {
  if (exists(name)) return open_group(name);
  Handle lcpl = detail::intermediate_groups_lcpl();
  hid_t id =
      TANDEM_H5_CHECK(H5Gcreate2(handle_.id(), name.c_str(), lcpl.id(), H5P_DEFAULT, H5P_DEFAULT),
                      "creating group ", where(name));
  return child(Handle(id), name);
}

bool Group::is_dataset(const std::string& name) const {
  if (!exists(name)) return false;
  // H5Oopen + H5Iget_type works the same on HDF5 1.10, 1.12 and 1.14 (H5Oget_info does not).
  Handle object(
      TANDEM_H5_CHECK(H5Oopen(handle_.id(), name.c_str(), H5P_DEFAULT), "opening ", where(name)));
  return H5Iget_type(object.id()) == H5I_DATASET;
}

std::vector<std::string> Group::children() const {
  std::vector<std::string> names;
  auto collect = [](hid_t, const char* name, const H5L_info_t*, void* data) -> herr_t {
    static_cast<std::vector<std::string>*>(data)->push_back(name);
    return 0;
  };
  hsize_t index = 0;
  TANDEM_H5_CHECK(H5Literate(handle_.id(), H5_INDEX_NAME, H5_ITER_INC, &index, collect, &names),
                  "listing ", file_, ":", path_);
  return names;
}

void Group::remove(const std::string& name) const {
  TANDEM_CHECK(exists(name), where(name), ": not found");
  TANDEM_H5_CHECK(H5Ldelete(handle_.id(), name.c_str(), H5P_DEFAULT), "deleting ", where(name));
}

namespace {

/// A fixed-length UTF-8 string type as wide as `value` (at least one byte), null-padded: no
/// global heap, so reading it never depends on a structure the format does not checksum.
Handle fixed_string_type(const std::string& value) {
  Handle type(TANDEM_H5_CHECK(H5Tcopy(H5T_C_S1), "string type"));
  TANDEM_H5_CHECK(H5Tset_size(type.id(), std::max<size_t>(value.size(), 1)), "string type");
  TANDEM_H5_CHECK(H5Tset_strpad(type.id(), H5T_STR_NULLPAD), "string type");
  TANDEM_H5_CHECK(H5Tset_cset(type.id(), H5T_CSET_UTF8), "string type");
  return type;
}

/// Writes `value` into the scalar attribute `attr` of fixed_string_type(value) `type`.
void write_fixed_string(hid_t type, hid_t attr, const std::string& value,
                        const std::string& where) {
  std::vector<char> buffer(std::max<size_t>(value.size(), 1), '\0');
  std::memcpy(buffer.data(), value.data(), value.size());
  TANDEM_H5_CHECK(H5Awrite(attr, type, buffer.data()), "writing attribute ", where);
}

}  // namespace

void Group::write_attr(const std::string& name, const std::string& value) const {
  Handle type = fixed_string_type(value);
  Handle space(TANDEM_H5_CHECK(H5Screate(H5S_SCALAR), "dataspace"));
  Handle attr(TANDEM_H5_CHECK(
      H5Acreate2(handle_.id(), name.c_str(), type.id(), space.id(), H5P_DEFAULT, H5P_DEFAULT),
      "creating attribute ", where(name)));
  write_fixed_string(type.id(), attr.id(), value, where(name));
  attr.close();
}

void Group::write_attr(const std::string& name, int64_t value) const {
  Handle space(TANDEM_H5_CHECK(H5Screate(H5S_SCALAR), "dataspace"));
  Handle attr(TANDEM_H5_CHECK(
      H5Acreate2(handle_.id(), name.c_str(), H5T_STD_I64LE, space.id(), H5P_DEFAULT, H5P_DEFAULT),
      "creating attribute ", where(name)));
  TANDEM_H5_CHECK(H5Awrite(attr.id(), H5T_NATIVE_INT64, &value), "writing attribute ", where(name));
  attr.close();
}

void Group::write_attr(const std::string& name, const std::vector<std::string>& values) const {
  Handle type(TANDEM_H5_CHECK(H5Tcopy(H5T_C_S1), "string type"));
  TANDEM_H5_CHECK(H5Tset_size(type.id(), H5T_VARIABLE), "string type");
  TANDEM_H5_CHECK(H5Tset_cset(type.id(), H5T_CSET_UTF8), "string type");
  const hsize_t n = values.size();
  Handle space(TANDEM_H5_CHECK(H5Screate_simple(1, &n, nullptr), "dataspace"));
  Handle attr(TANDEM_H5_CHECK(
      H5Acreate2(handle_.id(), name.c_str(), type.id(), space.id(), H5P_DEFAULT, H5P_DEFAULT),
      "creating attribute ", where(name)));
  std::vector<const char*> texts;
  for (const std::string& v : values) texts.push_back(v.c_str());
  if (!texts.empty())
    TANDEM_H5_CHECK(H5Awrite(attr.id(), type.id(), texts.data()), "writing attribute ",
                    where(name));
  attr.close();
}

void Group::write_attr_fixed(const std::string& name,
                             const std::vector<std::string>& values) const {
  size_t width = 1;
  for (const std::string& v : values) width = std::max(width, v.size());
  Handle type(TANDEM_H5_CHECK(H5Tcopy(H5T_C_S1), "string type"));
  TANDEM_H5_CHECK(H5Tset_size(type.id(), width), "string type");
  TANDEM_H5_CHECK(H5Tset_strpad(type.id(), H5T_STR_NULLPAD), "string type");
  const hsize_t n = values.size();
  Handle space(TANDEM_H5_CHECK(H5Screate_simple(1, &n, nullptr), "dataspace"));
  Handle attr(TANDEM_H5_CHECK(
      H5Acreate2(handle_.id(), name.c_str(), type.id(), space.id(), H5P_DEFAULT, H5P_DEFAULT),
      "creating attribute ", where(name)));
  std::vector<char> buffer(width * values.size(), '\0');
  for (size_t i = 0; i < values.size(); ++i)
    std::memcpy(buffer.data() + i * width, values[i].data(), values[i].size());
  if (!values.empty())
    TANDEM_H5_CHECK(H5Awrite(attr.id(), type.id(), buffer.data()), "writing attribute ",
                    where(name));
  attr.close();
}

void Group::write_attr_of(const std::string& object, const std::string& name,
                          const std::string& value) const {
  TANDEM_CHECK(exists(object), where(object), ": not found");
  Handle type = fixed_string_type(value);
  Handle space(TANDEM_H5_CHECK(H5Screate(H5S_SCALAR), "dataspace"));
  Handle attr(
      TANDEM_H5_CHECK(H5Acreate_by_name(handle_.id(), object.c_str(), name.c_str(), type.id(),
                                        space.id(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                      "creating attribute ", name, " of ", where(object)));
  write_fixed_string(type.id(), attr.id(), value, name + " of " + where(object));
  attr.close();
}

std::optional<std::string> Group::read_attr_string_of(const std::string& object,
                                                      const std::string& name) const {
  TANDEM_CHECK(exists(object), where(object), ": not found");
  silence_hdf5();
  const htri_t present = H5Aexists_by_name(handle_.id(), object.c_str(), name.c_str(), H5P_DEFAULT);
  if (present < 0)
    TANDEM_THROW(where(object), ": its attributes cannot be read (", detail::hdf5_message(),
                 "); the file is damaged");
  if (present == 0) return std::nullopt;
  Handle opened(TANDEM_H5_CHECK(H5Oopen(handle_.id(), object.c_str(), H5P_DEFAULT), "opening ",
                                where(object)));
  return child(std::move(opened), object).read_attr_string(name);
}

bool Group::has_attr(const std::string& name) const {
  silence_hdf5();
  // A failure is not "absent": the object's attributes cannot be read (a damaged attribute
  // index), and a reader must not take a default for a value the file holds.
  const htri_t result = H5Aexists(handle_.id(), name.c_str());
  if (result < 0)
    TANDEM_THROW(file_, ":", path_, ": its attribute ", name, " cannot be looked up (",
                 detail::hdf5_message(), "); the file is damaged");
  return result > 0;
}

void Group::remove_attr(const std::string& name) const {
  TANDEM_CHECK(has_attr(name), where(name), ": attribute not found");
  TANDEM_H5_CHECK(H5Adelete(handle_.id(), name.c_str()), "deleting attribute ", where(name));
}

std::string Group::read_attr_string(const std::string& name) const {
  const std::vector<std::string> values = read_attr_strings(name);
  TANDEM_CHECK(values.size() == 1, where(name), ": expected one string, found ", values.size());
  return values[0];
}

int64_t Group::read_attr_int64(const std::string& name) const {
  TANDEM_CHECK(has_attr(name), where(name), ": attribute not found");
  Handle attr(TANDEM_H5_CHECK(H5Aopen(handle_.id(), name.c_str(), H5P_DEFAULT),
                              "opening attribute ", where(name)));
  Handle type(TANDEM_H5_CHECK(H5Aget_type(attr.id()), "type of ", where(name)));
  TANDEM_CHECK(H5Tget_class(type.id()) == H5T_INTEGER, where(name), ": not an integer");
  int64_t value = 0;
  TANDEM_H5_CHECK(H5Aread(attr.id(), H5T_NATIVE_INT64, &value), "reading attribute ", where(name));
  return value;
}

std::vector<std::string> Group::read_attr_strings(const std::string& name) const {
  TANDEM_CHECK(has_attr(name), where(name), ": attribute not found");
  Handle attr(TANDEM_H5_CHECK(H5Aopen(handle_.id(), name.c_str(), H5P_DEFAULT),
                              "opening attribute ", where(name)));
  Handle type(TANDEM_H5_CHECK(H5Aget_type(attr.id()), "type of ", where(name)));
  Handle space(TANDEM_H5_CHECK(H5Aget_space(attr.id()), "dataspace of ", where(name)));
  const hssize_t n = H5Sget_simple_extent_npoints(space.id());
  std::vector<std::string> out;
  // An empty list has no strings to type: Keras writes weight_names=[] as numpy's default, an
  // empty float64 array.
  if (n <= 0) return out;
  TANDEM_CHECK(H5Tget_class(type.id()) == H5T_STRING, where(name), ": not a string attribute");
  {
    // Bound the allocation by the file's size: every string takes at least a byte in it.
    Handle file(TANDEM_H5_CHECK(H5Iget_file_id(attr.id()), "file of ", where(name)));
    hsize_t file_bytes = 0;
    TANDEM_H5_CHECK(H5Fget_filesize(file.id(), &file_bytes), "size of the file of ", where(name));
    const hsize_t per_string = H5Tis_variable_str(type.id()) > 0 ? 1 : H5Tget_size(type.id());
    TANDEM_CHECK(static_cast<hsize_t>(n) <= file_bytes / std::max<hsize_t>(per_string, 1),
                 where(name), ": declares ", n, " strings, more than its file of ", file_bytes,
                 " bytes can hold; the file is damaged");
  }
  if (H5Tis_variable_str(type.id()) > 0) {
    // The strings are in the file's global heaps, which libhdf5 reads without checks.
    check_global_heaps(file_);
    Handle memtype(TANDEM_H5_CHECK(H5Tcopy(H5T_C_S1), "string type"));
    TANDEM_H5_CHECK(H5Tset_size(memtype.id(), H5T_VARIABLE), "string type");
    TANDEM_H5_CHECK(H5Tset_cset(memtype.id(), H5Tget_cset(type.id())), "string type");
    // A sound heap can still be pointed at wrongly by a damaged element (an address or index
    // that is no heap object), and libhdf5 follows it without checks (fuzzing found reads past
    // a collection, wild allocations, crashes): the strings are read in a child process.
    return detail::read_vlen_strings(attr.id(), memtype.id(), static_cast<size_t>(n), file_,
                                     object_id("."), name, where(name));
  } else {
    const size_t size = H5Tget_size(type.id());
    std::vector<char> buffer(size * static_cast<size_t>(n));
    TANDEM_H5_CHECK(H5Aread(attr.id(), type.id(), buffer.data()), "reading attribute ",
                    where(name));
    for (hssize_t i = 0; i < n; ++i) {
      const char* begin = buffer.data() + static_cast<size_t>(i) * size;
      out.emplace_back(begin, strnlen(begin, size));
    }
  }
  return out;
}

}  // namespace tandem::h5
