// Table<tensorflow::tstring, V> instantiations for every value dtype.
#include "de_table_impl.h"

namespace tfra_de {

Status NewTableString(const TableConfig& cfg, TableBase** out) {
  return NewTableFor<tensorflow::tstring>(cfg, out);
}

}  // namespace tfra_de
