// The whole public API of Tandem: #include "tandem/tandem.h".
#pragma once

#include "tandem/autograd/tape.h"
#include "tandem/autograd/variable.h"
#include "tandem/core/build_info.h"
#include "tandem/core/device.h"
#include "tandem/core/dtype.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"
#include "tandem/core/shape.h"
#include "tandem/core/threading.h"
#include "tandem/ops/ops.h"
#include "tandem/tensor/allocator.h"
#include "tandem/tensor/random.h"
#include "tandem/tensor/tensor.h"
