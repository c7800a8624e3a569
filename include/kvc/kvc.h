/*! \file kvc/kvc.h
 *  \brief Umbrella header: everything an engine needs from kvc (host API). The kernel layer
 *  (the headers in kvc/kernels) needs the CUDA runtime headers and is included separately.
 */
#pragma once

#include "kvc/attention/attention.h"
#include "kvc/attention/merge.h"
#include "kvc/config.h"
#include "kvc/core/error.h"
#include "kvc/core/numeric.h"
#include "kvc/core/tensor.h"
#include "kvc/core/types.h"
#include "kvc/defaults.h"
#include "kvc/dsv4/dsv4.h"
#include "kvc/formats/formats.h"
#include "kvc/index/block_index.h"
#include "kvc/planner/planner.h"
#include "kvc/select/selection.h"
#include "kvc/select/selector.h"
#include "kvc/store/block_codec.h"
#include "kvc/store/kv_store.h"
#include "kvc/telemetry/telemetry.h"
