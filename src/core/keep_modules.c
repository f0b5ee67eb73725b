/* keep_modules.c - the sanitizer build only (DTENSOR_SANITIZE): dlclose does nothing, so every
 * shared object a process loads stays mapped until it exits.
 *
 * LeakSanitizer reports at exit, after MPI_Finalize has unloaded Open MPI's components and the
 * PMIx library they brought in. Their allocations at init then have return addresses in no
 * module, which no suppression (tests/lsan.supp, by library name) can match; ASan's slow
 * unwinder (fast_unwind_on_malloc=0) found a deeper frame in a library still loaded, at the
 * cost of a full unwind per malloc (measured: test_fsdp at np 4 under ASan, 27.6 s against 8.5 s
 * with the default fast unwinder). With the objects kept, the fast unwinder's first frame names
 * the component and the suppressions match. Exported with default visibility so that it
 * interposes on libc's for every library in the process (the executable's or libdtensor's
 * definition comes before libc's in the global scope); the static library's users pull it in
 * through the link options set with it in CMakeLists.txt (-u dt__keep_modules and
 * --export-dynamic-symbol=dlclose: an executable exports only what is asked). */
#include <dlfcn.h>

/* what the link option -u names, so that a static link takes this object */
__attribute__((visibility("default"))) const int dt__keep_modules = 1;

__attribute__((visibility("default"))) int dlclose(void* handle) {
  (void)handle;
  return 0;
}
