// Table<int32_t, V> instantiations for every value dtype.
#include "de_table_impl.h"

namespace tfra_de {

Status NewTableInt32(const TableConfig& cfg, TableBase** out) {
  return NewTableFor<int32_t>(cfg, out);
}

}  // namespace tfra_de
