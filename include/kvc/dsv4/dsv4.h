/*! \file kvc/dsv4/dsv4.h
 *  \brief DeepSeek-V4 compressed attention (CSA / HCA) in one include: entry formats and paged
 *  stores, the compressor, the lightning indexer with top-k, and sparse attention.
 *  docs/dsv4.md walks through one layer's decode step with them.
 */
#pragma once

#include "kvc/dsv4/compressor.h"
#include "kvc/dsv4/entry_format.h"
#include "kvc/dsv4/entry_store.h"
#include "kvc/dsv4/index_math.h"
#include "kvc/dsv4/indexer.h"
#include "kvc/dsv4/math.h"
#include "kvc/dsv4/sparse_attention.h"
