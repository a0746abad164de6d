// FileImage (internal/file_image.h): recording a checkpoint file in memory, and writing it.
#include "tandem/checkpoint/internal/file_image.h"

#include <emmintrin.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <utility>

#include "tandem/checkpoint/internal/file_io.h"
#include "tandem/checkpoint/internal/layout.h"
#include "tandem/io/internal/hdf5_file.h"

namespace tandem::detail {

namespace {

/// Tensors from this size are copied with non-temporal stores: the image's memory was last
/// written by the writer thread (on another core), and reading it into this core's cache before
/// overwriting it (what an ordinary copy does) made an asynchronous save's copy up to 1.6x
/// slower than a copy into memory this core had just freed.
constexpr size_t kStreamCopyBytes = size_t{64} << 10;

void copy_for_image(void* to, const void* from, size_t bytes) {
  auto* out = static_cast<char*>(to);
  const auto* in = static_cast<const char*>(from);
  // Tensor storage is 64-byte aligned: whole 16-byte lanes, then the tail.
  if (bytes < kStreamCopyBytes || reinterpret_cast<uintptr_t>(out) % 16 != 0) {
    std::memcpy(out, in, bytes);
    return;
  }
  const size_t lanes = bytes / 16;
  for (size_t i = 0; i < lanes; ++i)
    _mm_stream_si128(reinterpret_cast<__m128i*>(out) + i,
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(in) + i));
  _mm_sfence();
  std::memcpy(out + lanes * 16, in + lanes * 16, bytes - lanes * 16);
}

}  // namespace

std::string ImageGroup::child(const std::string& name) const {
  return path_.empty() ? name : path_ + "/" + name;
}

ImageOp& ImageGroup::add(ImageOp::Kind kind, const std::string& name) const {
  ImageOp& op = image_->ops.emplace_back();
  op.kind = kind;
  op.group = path_;
  op.name = name;
  return op;
}

ImageGroup ImageGroup::create_group(const std::string& name) const {
  add(ImageOp::Kind::kCreateGroup, name);
  return ImageGroup(image_, child(name));
}

ImageGroup ImageGroup::require_group(const std::string& name) const {
  add(ImageOp::Kind::kRequireGroup, name);
  return ImageGroup(image_, child(name));
}

void ImageGroup::write_tensor(const std::string& name, const Tensor& tensor) const {
  const Tensor host = tensor.to(Device::cpu());
  Tensor copy = Tensor::empty(host.shape(), host.dtype());
  copy_for_image(copy.raw_data(), host.raw_data(), host.nbytes());
  image_->tensor_bytes += static_cast<int64_t>(copy.nbytes());
  add(ImageOp::Kind::kTensor, name).tensor = std::move(copy);
}

void ImageGroup::write_u64(const std::string& name, const std::vector<uint64_t>& values,
                           const Shape& shape) const {
  ImageOp& op = add(ImageOp::Kind::kU64, name);
  op.u64 = values;
  op.shape = shape;
  image_->tensor_bytes += static_cast<int64_t>(values.size() * sizeof(uint64_t));
}

void ImageGroup::write_attr(const std::string& name, const std::string& value) const {
  add(ImageOp::Kind::kAttrString, name).text = value;
}

void ImageGroup::write_attr_later(const std::string& name,
                                  std::function<std::string()> make) const {
  add(ImageOp::Kind::kAttrString, name).text_later = std::move(make);
}

void ImageGroup::write_attr(const std::string& name, int64_t value) const {
  add(ImageOp::Kind::kAttrInt, name).integer = value;
}

void ImageGroup::write_attr(const std::string& name, const std::vector<std::string>& values) const {
  add(ImageOp::Kind::kAttrStrings, name).texts = values;
}

void ImageGroup::write_attr_fixed(const std::string& name,
                                  const std::vector<std::string>& values) const {
  add(ImageOp::Kind::kAttrFixedStrings, name).texts = values;
}

void ImageGroup::write_attr_of(const std::string& object, const std::string& name,
                               const std::string& value) const {
  ImageOp& op = add(ImageOp::Kind::kAttrOf, name);
  op.object = object;
  op.text = value;
}

void ImageGroup::save_point(std::string_view point) const {
  add(ImageOp::Kind::kSavePoint, std::string(point));
}

namespace {

void replay(const FileImage& image, const h5::Group& root) {
  std::map<std::string, h5::Group> groups;  // by path, below the root
  auto group = [&](const std::string& path) -> const h5::Group& {
    if (path.empty()) return root;
    const auto it = groups.find(path);
    if (it != groups.end()) return it->second;
    return groups.emplace(path, root.open_group(path)).first->second;
  };
  auto keep = [&](const std::string& path, h5::Group made) {
    groups.erase(path);
    groups.emplace(path, std::move(made));
  };
  for (const ImageOp& op : image.ops) {
    using Kind = ImageOp::Kind;
    const std::string child = op.group.empty() ? op.name : op.group + "/" + op.name;
    switch (op.kind) {
      case Kind::kCreateGroup:
        keep(child, group(op.group).create_group(op.name));
        break;
      case Kind::kRequireGroup:
        keep(child, group(op.group).require_group(op.name));
        break;
      case Kind::kTensor:
        group(op.group).write_tensor(op.name, op.tensor);
        break;
      case Kind::kU64:
        group(op.group).write_u64(op.name, op.u64, op.shape);
        break;
      case Kind::kAttrString:
        group(op.group).write_attr(op.name, op.text_later ? op.text_later() : op.text);
        break;
      case Kind::kAttrInt:
        group(op.group).write_attr(op.name, op.integer);
        break;
      case Kind::kAttrStrings:
        group(op.group).write_attr(op.name, op.texts);
        break;
      case Kind::kAttrFixedStrings:
        group(op.group).write_attr_fixed(op.name, op.texts);
        break;
      case Kind::kAttrOf:
        group(op.group).write_attr_of(op.object, op.name, op.text);
        break;
      case Kind::kSavePoint:
        checkpoint_save_point(op.name);
        break;
    }
  }
}

}  // namespace

void write_image(const FileImage& image, const std::string& path) {
  // A name at which nothing exists: HDF5 opens an existing name (following a symbolic link)
  // before its exclusive create refuses it, so a name another process holds is never handed
  // to it. On an error the name is removed (a partly made file; never a link's target).
  const std::string temp = unused_temp_path_for(path);
  try {
    h5::File file = h5::File::create(temp);  // exclusive create: never reuses a stranger's file
    checkpoint_save_point("temp_created");
    replay(image, file.root());
    file.close();
    checkpoint_save_point("temp_closed");
    // A file a restore would refuse (an accumulator or metric gone NaN, a loss scale run down
    // to 0) does not become a checkpoint, nor rotate an older one away: the file is read back
    // through the validation every restore runs first (pages just written: a read from memory).
    try {
      const h5::File written = open_checkpoint(temp);
      validate_checkpoint(written.root(), temp);
    } catch (const std::exception& e) {
      TANDEM_THROW("checkpoint: not writing ", path, ": the file written would not restore (",
                   e.what(), "); nothing was written");
    }
    // The bytes must reach the disk before the rename makes them the checkpoint: otherwise a
    // power loss could leave `path` naming a file whose blocks were never written.
    fsync_file(temp);
    checkpoint_save_point("temp_synced");
    rename_file(temp, path);
    // The rename is a change to the directory: fsync it so that the new name is durable.
    fsync_directory(std::filesystem::path(path).parent_path().string());
    checkpoint_save_point("renamed");
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(temp, ignored);
    throw;
  }
}

}  // namespace tandem::detail
