// FileImage (internal): a checkpoint file as it will be written, held in host memory. The
// writers record groups, attributes and datasets into it (ImageGroup has the h5::Group
// methods they use, tensors copied at the call), and write_image replays it into a file. A
// save takes the image at once, while nothing changes the state; the file can then be written
// later, on another thread (CheckpointManager's asynchronous saves).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/core/shape.h"
#include "tandem/tensor/tensor.h"

namespace tandem::detail {

struct ImageOp {
  enum class Kind {
    kCreateGroup,
    kRequireGroup,
    kTensor,
    kU64,
    kAttrString,
    kAttrInt,
    kAttrStrings,       ///< variable-length strings
    kAttrFixedStrings,  ///< fixed-length strings
    kAttrOf,            ///< a string attribute of `object` below the group
    kSavePoint,         ///< checkpoint_save_point(name) when the replay reaches it
  };
  Kind kind = Kind::kSavePoint;
  std::string group;  ///< the group's path from the root ("" for the root)
  std::string name;
  std::string object;
  std::string text;
  /// kAttrString: when set, makes `text` as the file is written (from values the image holds).
  std::function<std::string()> text_later;
  int64_t integer = 0;
  std::vector<std::string> texts;
  Tensor tensor;  ///< a host copy
  std::vector<uint64_t> u64;
  Shape shape;
};

/// The recorded operations, in order, and the bytes of tensor data they hold.
struct FileImage {
  std::vector<ImageOp> ops;
  int64_t tensor_bytes = 0;
};

/// A group of a FileImage: records what is written into it.
class ImageGroup {
 public:
  /// The root of `image`.
  explicit ImageGroup(std::shared_ptr<FileImage> image) : image_(std::move(image)) {}

  ImageGroup create_group(const std::string& name) const;
  ImageGroup require_group(const std::string& name) const;
  /// Copies `tensor` to host memory now.
  void write_tensor(const std::string& name, const Tensor& tensor) const;
  void write_u64(const std::string& name, const std::vector<uint64_t>& values,
                 const Shape& shape) const;
  void write_attr(const std::string& name, const std::string& value) const;
  /// A string attribute whose value `make` computes when the file is written, on the thread
  /// that writes it: `make` must use only values it holds, never the live objects.
  void write_attr_later(const std::string& name, std::function<std::string()> make) const;
  void write_attr(const std::string& name, int64_t value) const;
  void write_attr(const std::string& name, const std::vector<std::string>& values) const;
  void write_attr_fixed(const std::string& name, const std::vector<std::string>& values) const;
  void write_attr_of(const std::string& object, const std::string& name,
                     const std::string& value) const;
  /// Marks the point of the save called `point` (the crash tests' hooks run there on replay).
  void save_point(std::string_view point) const;

 private:
  ImageGroup(std::shared_ptr<FileImage> image, std::string path)
      : image_(std::move(image)), path_(std::move(path)) {}
  ImageOp& add(ImageOp::Kind kind, const std::string& name) const;
  std::string child(const std::string& name) const;

  std::shared_ptr<FileImage> image_;
  std::string path_;
};

/// Writes `image` to `path` by Tandem's protocol: a temporary file (exclusive create), read back
/// through validate_checkpoint (a file a restore would refuse raises), synced, renamed into
/// place, the directory synced; on an error the temporary is removed and the error raised
/// (nothing at `path` changes).
void write_image(const FileImage& image, const std::string& path);

}  // namespace tandem::detail
