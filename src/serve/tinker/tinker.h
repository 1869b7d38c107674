/*
 * tinker.h -- internal to src/serve/tinker/ (and the C tests in
 * tests/serve/): the Tinker SDK's protocol, which the core reaches only
 * through the serve_protocol that serve_register_tinker fills in.
 */
#ifndef ZDP_SERVE_TINKER_H
#define ZDP_SERVE_TINKER_H

#include "serve_impl.h"

tinker_state *tinker_create(void);
void tinker_destroy(tinker_state *t);
/* The handler for every path under /api/v1/ (sub: the rest of the path). */
enum MHD_Result tinker_handle(server *s, struct MHD_Connection *c, const char *sub,
                              const char *method, const char *body, size_t len);
/* Main thread, s->mu held: a Tinker job finished with (status, body); the
 * job is freed here. */
void tinker_finish_locked(server *s, job *j, int status, char *body);
/* Main thread, s->mu held: releases seq_ids held back longer than the gap
 * timeout; returns true if it queued anything. */
bool tinker_tick_locked(server *s);
/* s->mu held: fails every held request (shutdown). */
void tinker_shutdown_locked(server *s);

#endif /* ZDP_SERVE_TINKER_H */
