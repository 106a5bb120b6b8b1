// etsdk-aoti kernels: one level library's table (table.h), built into libetsdk_aoti_kernels_<level>.so once per
// instruction-set level with that level's flags; vec::kLevel names the level the flags selected, so a library
// built with the wrong flags is caught by etsdk_aoti.kernels, which compares the name with the level it asked for.

#include "table.h"
#include "vec.h"

namespace {

const etsdk_kernels::KernelTable kTable = {
    etsdk_kernels::kTableAbi, etsdk_kernels::vec::kLevel, etsdk_kernels::qmm, etsdk_kernels::qmm_a8,
    etsdk_kernels::linear,    etsdk_kernels::attention,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const etsdk_kernels::KernelTable* etsdk_kernels_table() { return &kTable; }
