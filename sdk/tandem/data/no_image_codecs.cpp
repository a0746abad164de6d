// decode_jpeg and decode_png in a build without libjpeg or libpng (TANDEM_WITH_IMAGES=0):
// they raise NotBuiltError saying how to get them.
#include "tandem/core/error.h"
#include "tandem/data/image.h"

namespace tandem::data {

namespace {
[[noreturn]] void not_built(const char* what) {
  throw NotBuiltError(std::string(what) +
                      ": Tandem was built without libjpeg and libpng (TANDEM_WITH_IMAGES=0). "
                      "Install libjpeg62-turbo-dev and libpng-dev (scripts/setup does) and "
                      "re-run CMake");
}
}  // namespace

Tensor decode_jpeg(std::string_view, int) { not_built("decode_jpeg"); }
Tensor decode_png(std::string_view, int) { not_built("decode_png"); }
std::string encode_png(const Tensor&) { not_built("encode_png"); }

}  // namespace tandem::data
