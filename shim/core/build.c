/* The build's facts, kept in the library's bytes so that `dgcshim doctor`
 * can read them from the file itself (no need to load it into a process
 * that may hold another MPI): it looks for the marker and reads the JSON
 * that follows, up to the NUL. */
#include "build_info.h"

__attribute__((used)) static const char build_info[] = "DGCSHIM-BUILD-INFO " DGC_BUILD_INFO_JSON;
