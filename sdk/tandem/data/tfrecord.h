// TFRecord files as a dataset (tf.data.TFRecordDataset) and list_files: the data of a
// tf.distribute job read as it is, records parsed with parse_example (example.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/data/dataset.h"
#include "tandem/io/tfrecord.h"

namespace tandem::data {

/// The records of TFRecord files, file after file, as elements {uint8 [record length]}.
/// The files are indexed when the dataset is made (each record's offset: a walk over the
/// record headers of an uncompressed file, a decompression of a compressed one), so the
/// dataset knows its cardinality, shuffles, shards and saves its position as any other
/// source: a restored iterator resumes at the exact record, and AutoShardPolicy::kFile deals
/// the files to workers. Both CRCs of a record are checked when it is read. A damaged record
/// raises naming the file and the record's offset; with `options.skip_damaged` the files are
/// checked whole when indexed and damaged records are left out (counted in the log and in
/// describe()).
Dataset tfrecord(std::vector<std::string> files, io::TFRecordReadOptions options = {});

/// The files matching a glob `pattern` ("data/train-*.tfrecord"), sorted by name; with
/// `shuffle`, in an order drawn from `seed` (the same for a given seed, as every worker must
/// see the same list before the files are dealt). No match raises, naming the pattern.
std::vector<std::string> list_files(const std::string& pattern, bool shuffle = false,
                                    uint64_t seed = 0);

/// The file names as a dataset (tf.data.Dataset.list_files' elements): element i is
/// {uint8 [bytes of files[i]]} (as_string() turns it back into a name). The files are the
/// dataset's for AutoShardPolicy::kFile, so
/// `file_names(list_files(...)).interleave(fn, ...)` deals whole files to the workers.
Dataset file_names(std::vector<std::string> files);

/// The bytes of a uint8 tensor of rank 1 (a file name of file_names, a record of tfrecord) as
/// a string; raises naming the dtype or shape of anything else.
std::string as_string(const Tensor& bytes);

}  // namespace tandem::data
