/* version — the library version string compiled in by CMake. */
#include "ect_config.h"
#include "util/util.h"

const char *ect_version(void) { return ECT_VERSION_STRING; }
