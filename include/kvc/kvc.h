/*! \file kvc/kvc.h
 *  \brief Umbrella header: everything an engine needs from kvc.
 */
#pragma once

#include "kvc/config.h"
#include "kvc/core/error.h"
#include "kvc/core/numeric.h"
#include "kvc/core/tensor.h"
#include "kvc/core/types.h"
#include "kvc/formats/formats.h"
#include "kvc/store/kv_store.h"
