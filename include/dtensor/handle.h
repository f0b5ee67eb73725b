/* dtensor/handle.h - safe handles: telling a live object from a destroyed or made-up one.
 *
 * Every handle the library gives out (mesh, plan, tensor, tape, variable, module, work, model,
 * optimizer, corpus) is recorded in one registry while it lives. Each public function looks its
 * handle arguments up there before reading them, so a destroyed handle or a second destroy is
 * DT_ERR_INVALID_USAGE and a pointer that never was a handle of that kind DT_ERR_INVALID_ARG,
 * each with a readable message, never a read of freed memory. The memory of a destroyed object is given back to the allocator
 * only after DT_HANDLE_QUARANTINE later destroys, so a stale handle is not soon the address of a
 * new object of the same kind (it would then name that object: this is the one case the registry
 * cannot tell apart, as with any pointer-valued handle).
 *
 * Code built on the library (wrappers, trainers) uses the same registry for its own objects:
 *
 *   static const dt_handle_kind_t MY_KIND = {"my_wrapper_t"};
 *   create:   obj = calloc(...); DT_CHECK(dt_handle_register(obj, &MY_KIND));
 *   use:      DT_CHECK(dt_handle_check(obj, &MY_KIND, "wrapper"));
 *   destroy:  DT_CHECK(dt_handle_unregister(obj, &MY_KIND, "wrapper")); ...; dt_handle_free(obj);
 *
 * The registry takes a short spin lock: any thread may call these.
 */
#ifndef DTENSOR_HANDLE_H
#define DTENSOR_HANDLE_H

#include "dtensor/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Destroyed objects whose memory is held back before it is freed. */
#define DT_HANDLE_QUARANTINE 4096

/* A kind of handle; compared by address (define one static instance per kind). */
typedef struct dt_handle_kind {
  const char* name; /* a noun for messages: "tensor" */
} dt_handle_kind_t;

/* Records `h` as a live handle of `kind`. DT_ERR_INVALID_USAGE when it is already live. */
DT_API dt_status_t dt_handle_register(const void* h, const dt_handle_kind_t* kind);
/* DT_SUCCESS when `h` is a live handle of `kind`. Otherwise (never reading *h): a destroyed
 * handle is DT_ERR_INVALID_USAGE ("<what> is not a live tensor: it was destroyed"); NULL, a
 * handle of another kind or a pointer the library never gave out is DT_ERR_INVALID_ARG. */
DT_API dt_status_t dt_handle_check(const void* h, const dt_handle_kind_t* kind, const char* what);
/* Whether `h` is a live handle of `kind` (no message). */
DT_API int dt_handle_is_live(const void* h, const dt_handle_kind_t* kind);
/* Marks `h` destroyed (the registry remembers it until its memory is freed through
 * dt_handle_free or the address is registered again); the errors of dt_handle_check when it is
 * not live: a second destroy changes nothing and is DT_ERR_INVALID_USAGE. */
DT_API dt_status_t dt_handle_unregister(const void* h, const dt_handle_kind_t* kind,
                                        const char* what);
/* Frees `p` (memory from malloc/calloc) once DT_HANDLE_QUARANTINE later objects have been freed
 * this way (at dt_finalize at the latest). NULL is a no-op. */
DT_API void dt_handle_free(void* p);

#ifdef __cplusplus
}
#endif
#endif /* DTENSOR_HANDLE_H */
