/*
 * http.c -- libmicrohttpd on rank 0 (docs/server.md, "Threat model" and
 * "Limits"): one thread per connection.  A request first passes guard_
 * (Host, Origin, the API key, Content-Type), its body is read into one
 * buffer counted against --max-inflight-bytes and cut off when slower than
 * --request-timeout-seconds (a watchdog thread does the same for headers),
 * then the route table below sends it to the protocol that owns its prefix
 * or to the plain API.
 */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include "serve_impl.h"

/* ---- who may send a request ------------------------------------------------------ */

bool serve_names_type(const char *value, const char *type) {
    const size_t n = strlen(type);
    for (const char *p = value; p != NULL && *p;) {
        while (*p == ' ' || *p == '\t' || *p == ',') p++;
        if (strncasecmp(p, type, n) == 0) {
            const char *q = p + n;
            while (*q == ' ' || *q == '\t') q++;
            if (*q == '\0' || *q == ',' || *q == ';') return true;
        }
        p = strchr(p, ',');
    }
    return false;
}

/* A Content-Type that is exactly this media type (parameters allowed):
 * stricter than serve_names_type, as a list is no Content-Type. */
static bool content_type_is_(const char *value, const char *type) {
    const size_t n = strlen(type);
    while (*value == ' ' || *value == '\t') value++;
    if (strncasecmp(value, type, n) != 0) return false;
    const char *q = value + n;
    while (*q == ' ' || *q == '\t') q++;
    return *q == '\0' || *q == ';';
}

/* host (a name, an IPv4 address or an IPv6 one without brackets) and port
 * (-1: none given) name this server?  The bound address, for a loopback
 * bind any loopback address and localhost, for a wildcard bind any address
 * and localhost, and --allow-host names (with any port: a reverse proxy's). */
static bool host_ok_(const server *s, int bound_port, const char *host, long port, bool bracketed) {
    for (int i = 0; i < s->opt.n_allow_hosts; i++)
        if (strcasecmp(host, s->opt.allow_hosts[i]) == 0) return true;
    if (port >= 0 && port != bound_port) return false;
    if (strcasecmp(host, "localhost") == 0) return s->bind_kind != 0;
    unsigned char a[16] = {0};
    int fam = 0;
    if (!bracketed && inet_pton(AF_INET, host, a) == 1) fam = AF_INET;
    else if (bracketed && inet_pton(AF_INET6, host, a) == 1) fam = AF_INET6;
    if (fam == 0) return false;
    if (s->bind_kind == 2) return true;
    if (s->bind_kind == 1) {
        static const unsigned char v6_loop[16] = {[15] = 1};
        if ((fam == AF_INET && a[0] == 127) || (fam == AF_INET6 && memcmp(a, v6_loop, 16) == 0)) return true;
    }
    return fam == s->bind_family && memcmp(a, s->bind_addr, fam == AF_INET ? 4 : 16) == 0;
}

/* "host[:port]" or "[v6][:port]" (a Host header, or an Origin after its
 * scheme); default_port stands for a missing port (-1: any). */
static bool authority_ok_(const server *s, int bound_port, const char *v, long default_port) {
    char host[256];
    const char *after;
    bool bracketed = v[0] == '[';
    if (bracketed) {
        const char *close = strchr(v, ']');
        if (close == NULL || close - v - 1 >= (long)sizeof host) return false;
        snprintf(host, sizeof host, "%.*s", (int)(close - v - 1), v + 1);
        after = close + 1;
    } else {
        size_t k = strcspn(v, ":");
        if (k >= sizeof host) return false;
        snprintf(host, sizeof host, "%.*s", (int)k, v);
        after = v + k;
    }
    long port = default_port;
    if (*after == ':') {
        char *end;
        errno = 0;
        port = strtol(after + 1, &end, 10);
        if (end == after + 1 || *end != '\0' || errno != 0 || port < 0 || port > 65535) return false;
    } else if (*after != '\0') {
        return false;
    }
    return host[0] != '\0' && host_ok_(s, bound_port, host, port, bracketed);
}

/* The API key, compared in constant time: the time depends on the key's
 * length, never on where a guess first differs. */
static bool key_matches_(const server *s, const char *got) {
    if (got == NULL) return false;
    const size_t n = strlen(got), m = s->api_key_len;
    volatile unsigned char diff = n != m;
    for (size_t i = 0; i < m; i++) diff |= (unsigned char)(s->api_key[i] ^ (i < n ? got[i] : 0));
    return diff == 0;
}

/* Every request passes here before its body is read: the Host and Origin
 * (a web page's requests, DNS rebinding), the API key, and a POST's
 * Content-Type (a page may POST text/plain cross-site without asking). */
static bool guard_(server *s, struct MHD_Connection *c, const char *url, const char *method, verr *e) {
    pthread_mutex_lock(&s->mu);
    const int port = s->bound_port; /* set just after the daemon started */
    pthread_mutex_unlock(&s->mu);
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    char where[320];
    snprintf(where, sizeof where, "%s%s%s:%d", s->bind_family == AF_INET6 ? "[" : "", s->opt.bind,
             s->bind_family == AF_INET6 ? "]" : "", port);
    if (host != NULL && !authority_ok_(s, port, host, -1))
        return serve_bad(e, 403, "Host", "Host: %.200s: this server answers requests addressed to %s%s only "
                         "(a web page can reach a local server under another name by DNS rebinding); the "
                         "operator can add a name with --allow-host NAME", host, where,
                         s->bind_kind != 0 ? " or localhost" : "");
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (origin != NULL) {
        bool ok = false;
        if (strncasecmp(origin, "http://", 7) == 0) ok = authority_ok_(s, port, origin + 7, 80);
        else if (strncasecmp(origin, "https://", 8) == 0) ok = authority_ok_(s, port, origin + 8, 443);
        if (!ok)
            return serve_bad(e, 403, "Origin", "Origin: %.200s: cross-site requests are refused (a web page "
                             "is not a client of this server; clients send no Origin, or this server's own)",
                             origin);
    }
    /* A URL under the protocol's prefix (prefix NULL: no protocol). */
    const serve_protocol *pr = &s->proto;
    const bool in_proto = pr->prefix != NULL && strncmp(url, pr->prefix, strlen(pr->prefix)) == 0;
    const bool health = !strcmp(method, "GET") &&
                        (!strcmp(url, "/healthz") || (in_proto && !strcmp(url + strlen(pr->prefix), "healthz")));
    if (s->api_key != NULL && !health) {
        const char *key = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-API-Key");
        const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
        bool ok = key_matches_(s, key);
        if (auth != NULL && strncasecmp(auth, "Bearer ", 7) == 0) {
            const char *tok = auth + 7;
            while (*tok == ' ') tok++;
            ok = key_matches_(s, tok) || ok;
        }
        if (!ok)
            return serve_bad(e, 401, key != NULL ? "X-API-Key" : auth != NULL ? "Authorization" : "X-API-Key",
                             "%s: this server needs its API key (--api-key-file): send X-API-Key: KEY or "
                             "Authorization: Bearer KEY", key != NULL || auth != NULL ? "wrong API key"
                                                                                      : "no API key");
    }
    if (!strcmp(method, "POST")) {
        const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
        const bool other = in_proto && pr->content_type != NULL;
        if (ct == NULL || !(content_type_is_(ct, "application/json") ||
                            (other && content_type_is_(ct, pr->content_type))))
            return serve_bad(e, 415, "Content-Type", "Content-Type: %.200s: a POST must be application/json%s "
                             "(curl: -H 'Content-Type: application/json')", ct ? ct : "(none)",
                             other ? pr->content_type_hint : "");
    }
    return true;
}

/* ---- HTTP (rank 0) ----------------------------------------------------------------- */

typedef struct conn_ctx {
    serve_bytes body; /* the request body as it arrives */
    bool too_big;
    bool refused; /* a guard (guard_) answered it already */
    bool no_room;      /* over --max-inflight-bytes: answered 503 */
    int64_t reserved;  /* bytes counted in s->inflight for this request */
    double t0;         /* when its headers were complete */
} conn_ctx;

/* The request-body budget (--max-inflight-bytes): every body byte a
 * connection holds is counted from the moment it is announced (its
 * Content-Length) or arrives (chunked) until the request is answered, so N
 * concurrent maximal bodies cannot exhaust memory; a request over the budget
 * is refused with 503 (the Tinker SDK retries 5xx). */
static bool body_reserve_(server *s, conn_ctx *cx, int64_t n) {
    pthread_mutex_lock(&s->body_mu);
    bool ok = s->inflight + n <= s->opt.max_inflight;
    if (ok) {
        s->inflight += n;
        cx->reserved += n;
    }
    pthread_mutex_unlock(&s->body_mu);
    return ok;
}

static void body_release_(server *s, conn_ctx *cx) {
    pthread_mutex_lock(&s->body_mu);
    s->inflight -= cx->reserved;
    pthread_mutex_unlock(&s->body_mu);
    cx->reserved = 0;
}

int64_t serve_body_inflight(server *s) {
    pthread_mutex_lock(&s->body_mu);
    int64_t n = s->inflight;
    pthread_mutex_unlock(&s->body_mu);
    return n;
}

enum MHD_Result serve_reply(struct MHD_Connection *c, int status, char *body) {
    if (body == NULL) {
        body = strdup("{\"error\": {\"message\": \"out of memory\", \"field\": null}}");
        status = 500;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (r == NULL) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

enum MHD_Result serve_reply_error(struct MHD_Connection *c, int status, const char *field, const char *fmt,
                                  ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return serve_reply(c, status, serve_error_body(field, msg));
}

enum MHD_Result serve_healthz(server *s, struct MHD_Connection *c) {
    const double limit = s->opt.health_timeout_s, now = serve_now();
    char msg[512] = "";
    int rank = -1;
    const char *what = NULL;
    double age = 0;
    pthread_mutex_lock(&s->mu);
    /* What the ranks run now and how many requests wait in the FIFO: a
     * client (and the tests of batched sampling) can see that a request
     * has started before it queues others behind it. */
    const char *running = s->busy_op >= 0 && s->busy_op < SERVE_N_OPS ? serve_ops[s->busy_op].name : NULL;
    long long queued = 0;
    for (const job *q = s->head; q != NULL; q = q->next) queued++;
    if (s->busy_op >= 0 && now - s->busy_since > limit) {
        what = running != NULL ? running : "request";
        age = now - s->busy_since;
        snprintf(msg, sizeof msg,
                 "the %s request has run for %.1f s on the ranks, more than --health-timeout-seconds %g: a rank "
                 "is stuck or overloaded (or raise the flag for requests this long)",
                 what, age, limit);
    } else if (s->ping_since > 0 && now - s->ping_since > limit) {
        rank = s->ping_missing;
        what = "health_check";
        age = now - s->ping_since;
        if (rank > 0)
            snprintf(msg, sizeof msg,
                     "rank %d has not answered the health check for %.1f s, more than --health-timeout-seconds "
                     "%g: it is stopped, stuck or starved",
                     rank, age, limit);
        else
            snprintf(msg, sizeof msg,
                     "the ranks have not received the health check for %.1f s, more than "
                     "--health-timeout-seconds %g: a rank is stopped, stuck or starved",
                     age, limit);
    }
    pthread_mutex_unlock(&s->mu);
    if (what == NULL) {
        json_t *ok = json_pack("{s:s,s:s?,s:I}", "status", "ok", "running", running, "queued",
                               (json_int_t)queued);
        return serve_reply(c, 200, ok != NULL ? serve_dump(ok) : strdup("{\"status\": \"ok\"}"));
    }
    json_t *o = json_pack("{s:s,s:s,s:f,s:{s:s,s:n}}", "status", "unhealthy", "waiting_for", what, "seconds",
                          age, "error", "message", msg, "field");
    if (o != NULL) json_object_set_new(o, "rank", rank > 0 ? json_integer(rank) : json_null());
    return serve_reply(c, 503, o != NULL ? serve_dump(o) : NULL);
}

/* The request deadline for headers.  libmicrohttpd's timeout is an idle
 * timeout, so a client that sends its headers a byte at a time keeps a
 * connection (and its thread) for ever.  Each open connection is tracked
 * from libmicrohttpd's connection notifications; while it is receiving a
 * request's headers (from when it opened, or from the previous answer on
 * it, until access_ first sees the request), a watchdog thread shuts down
 * the socket of one that has taken longer than --request-timeout-seconds,
 * and libmicrohttpd then closes it.  The body has its own deadline in
 * access_.  libmicrohttpd reports a connection closed (conn_notify_, which
 * takes watch_mu) before it closes its socket, so the watchdog never
 * touches a descriptor that has been reused. */
typedef struct conn_watch {
    int fd;
    double since;   /* when it began waiting for a request's headers */
    bool receiving; /* between requests or in their headers */
    bool cut;
    struct conn_watch *prev, *next;
} conn_watch;

static conn_watch *watch_of_(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci != NULL ? ci->socket_context : NULL;
}

/* receiving: the connection waits for a request's headers again (true) or
 * has a whole request head (false). */
static void watch_mark_(server *s, struct MHD_Connection *c, bool receiving) {
    conn_watch *w = watch_of_(c);
    if (w == NULL) return;
    pthread_mutex_lock(&s->watch_mu);
    w->receiving = receiving;
    w->since = serve_now();
    pthread_mutex_unlock(&s->watch_mu);
}

static void conn_notify_(void *cls, struct MHD_Connection *c, void **socket_context,
                         enum MHD_ConnectionNotificationCode toe) {
    server *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        conn_watch *w = ci != NULL ? calloc(1, sizeof *w) : NULL;
        if (w == NULL) return; /* not watched: the idle timeout still applies */
        w->fd = ci->connect_fd;
        w->since = serve_now();
        w->receiving = true;
        pthread_mutex_lock(&s->watch_mu);
        w->next = s->watch;
        if (s->watch != NULL) s->watch->prev = w;
        s->watch = w;
        pthread_mutex_unlock(&s->watch_mu);
        *socket_context = w;
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED && *socket_context != NULL) {
        conn_watch *w = *socket_context;
        pthread_mutex_lock(&s->watch_mu);
        if (w->prev != NULL) w->prev->next = w->next;
        else s->watch = w->next;
        if (w->next != NULL) w->next->prev = w->prev;
        pthread_mutex_unlock(&s->watch_mu);
        free(w);
        *socket_context = NULL;
    }
}

static void *watchdog_(void *arg) {
    server *s = arg;
    const struct timespec tick = {0, 250000000};
    for (;;) {
        pthread_mutex_lock(&s->watch_mu);
        if (s->watch_stop) {
            pthread_mutex_unlock(&s->watch_mu);
            return NULL;
        }
        const double now = serve_now();
        for (conn_watch *w = s->watch; w != NULL; w = w->next) {
            if (w->receiving && !w->cut && now - w->since > s->opt.request_timeout_s) {
                shutdown(w->fd, SHUT_RDWR);
                w->cut = true;
            }
        }
        pthread_mutex_unlock(&s->watch_mu);
        nanosleep(&tick, NULL);
    }
}

static void watchdog_stop_(server *s) {
    pthread_mutex_lock(&s->watch_mu);
    s->watch_stop = true;
    pthread_mutex_unlock(&s->watch_mu);
    pthread_join(s->watch_thread, NULL);
}

/* The route table: a protocol's prefix, else the plain API. */
static enum MHD_Result route_(server *s, struct MHD_Connection *c, const char *url, const char *method,
                              conn_ctx *cx) {
    const serve_protocol *p = &s->proto;
    if (p->prefix != NULL && strncmp(url, p->prefix, strlen(p->prefix)) == 0)
        return p->handle(s, c, url + strlen(p->prefix), method, (const char *)cx->body.p, cx->body.len);
    return serve_plain_handle(s, c, url, method, (const char *)cx->body.p, cx->body.len);
}

static enum MHD_Result access_(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version, const char *upload_data,
                               size_t *upload_data_size, void **con_cls) {
    (void)version;
    server *s = cls;
    conn_ctx *cx = *con_cls;
    if (cx == NULL) {
        cx = calloc(1, sizeof *cx);
        if (cx == NULL) return MHD_NO;
        *con_cls = cx;
        cx->t0 = serve_now();
        watch_mark_(s, c, false);
        verr e = {0};
        if (!guard_(s, c, url, method, &e)) {
            cx->refused = true; /* its body, if any, is read and dropped */
            return serve_reply(c, e.status, serve_error_body(e.field, e.msg));
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl != NULL) {
            char *end;
            errno = 0;
            unsigned long long n = strtoull(cl, &end, 10);
            /* Compared unsigned: a length past INT64_MAX is not negative. */
            if (end != cl && (errno == ERANGE || n > (unsigned long long)s->opt.max_body)) {
                cx->too_big = true;
                return serve_reply_error(c, 413, "body", "the body has %s bytes, more than --max-body %lld",
                                    cl, (long long)s->opt.max_body);
            }
            if (errno == 0 && end != cl && n > 0 && !body_reserve_(s, cx, (int64_t)n)) {
                cx->no_room = true;
                return serve_reply_error(c, 503, "body",
                                    "the server already holds %lld bytes of request bodies and this one has "
                                    "%llu (--max-inflight-bytes %lld): retry later",
                                    (long long)serve_body_inflight(s), n, (long long)s->opt.max_inflight);
            }
        }
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        /* A client that sends its body slower than --request-timeout-seconds
         * allows loses the connection (slow-body attacks hold a thread). */
        if (serve_now() - cx->t0 > s->opt.request_timeout_s) return MHD_NO;
        if (cx->too_big || cx->no_room || cx->refused) return MHD_YES;
        if ((long long)(cx->body.len + n) > s->opt.max_body) {
            cx->too_big = true;
            serve_bytes_free(&cx->body);
            body_release_(s, cx);
            return MHD_YES;
        }
        /* A chunked body (no Content-Length) is counted as it arrives. */
        if ((int64_t)(cx->body.len + n) > cx->reserved &&
            !body_reserve_(s, cx, (int64_t)(cx->body.len + n) - cx->reserved)) {
            cx->no_room = true;
            serve_bytes_free(&cx->body);
            body_release_(s, cx);
            return MHD_YES;
        }
        /* A body of known length gets its exact size at once. */
        if (cx->body.cap == 0 && cx->reserved > 4096 && !serve_reserve(&cx->body, (size_t)cx->reserved))
            return MHD_NO;
        if (!serve_put(&cx->body, upload_data, n)) return MHD_NO;
        return MHD_YES;
    }
    if (cx->refused) return MHD_YES; /* answered when it arrived */
    if (cx->too_big)
        return serve_reply_error(c, 413, "body", "the body is larger than --max-body %lld bytes",
                            (long long)s->opt.max_body);
    if (cx->no_room)
        return serve_reply_error(c, 503, "body",
                            "the server already holds %lld bytes of request bodies (--max-inflight-bytes "
                            "%lld): retry later",
                            (long long)serve_body_inflight(s), (long long)s->opt.max_inflight);
    return route_(s, c, url, method, cx);
}

static void completed_(void *cls, struct MHD_Connection *c, void **con_cls,
                       enum MHD_RequestTerminationCode toe) {
    (void)toe;
    watch_mark_(cls, c, true);
    conn_ctx *cx = *con_cls;
    if (cx != NULL) {
        body_release_(cls, cx);
        serve_bytes_free(&cx->body);
        free(cx);
        *con_cls = NULL;
    }
}

/* libmicrohttpd's messages ("Server reached connection limit", a client
 * that hung up): at most 10 lines every 10 s, so that a flood of refused
 * connections cannot fill the log; the rest are counted. */
static void http_log_(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static double window;
    static int lines;
    static long dropped;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n > 0 && msg[n - 1] == '\n') msg[--n] = '\0';
    const double now = serve_now();
    pthread_mutex_lock(&mu);
    if (now - window >= 10) {
        if (dropped > 0) fprintf(stderr, "zdp serve: http: %ld more messages in the last 10 s not shown\n", dropped);
        window = now;
        lines = 0;
        dropped = 0;
    }
    if (lines < 10) {
        lines++;
        fprintf(stderr, "zdp serve: http: %s\n", msg);
    } else {
        dropped++;
    }
    pthread_mutex_unlock(&mu);
}

static struct MHD_Daemon *start_http_(server *s, char *why, size_t cap, int *port) {
    struct sockaddr_in a4;
    struct sockaddr_in6 a6;
    struct sockaddr *sa;
    /* One thread per connection: handlers block (a plain request waits for
     * its answer, retrieve_future holds a long poll), which a thread pool
     * would turn into head-of-line blocking of /healthz.  poll(), not
     * select(): descriptors above FD_SETSIZE work. */
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                     MHD_USE_ERROR_LOG;
    memset(&a4, 0, sizeof a4);
    memset(&a6, 0, sizeof a6);
    static const unsigned char zero[16], v6_loop[16] = {[15] = 1};
    if (inet_pton(AF_INET, s->opt.bind, &a4.sin_addr) == 1) {
        a4.sin_family = AF_INET;
        a4.sin_port = htons((uint16_t)s->opt.port);
        sa = (struct sockaddr *)&a4;
        s->bind_family = AF_INET;
        memcpy(s->bind_addr, &a4.sin_addr, 4);
        s->bind_kind = s->bind_addr[0] == 127 ? 1 : memcmp(s->bind_addr, zero, 4) == 0 ? 2 : 0;
    } else if (inet_pton(AF_INET6, s->opt.bind, &a6.sin6_addr) == 1) {
        a6.sin6_family = AF_INET6;
        a6.sin6_port = htons((uint16_t)s->opt.port);
        sa = (struct sockaddr *)&a6;
        flags |= MHD_USE_IPv6;
        s->bind_family = AF_INET6;
        memcpy(s->bind_addr, &a6.sin6_addr, 16);
        s->bind_kind = memcmp(s->bind_addr, v6_loop, 16) == 0 ? 1 : memcmp(s->bind_addr, zero, 16) == 0 ? 2 : 0;
    } else {
        snprintf(why, cap, "--bind %s: not an IPv4 or IPv6 address (for example 127.0.0.1 or ::1)",
                 s->opt.bind);
        return NULL;
    }
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)s->opt.port, NULL, NULL, access_, s, MHD_OPTION_SOCK_ADDR, sa,
        MHD_OPTION_NOTIFY_COMPLETED, completed_, s, MHD_OPTION_NOTIFY_CONNECTION, conn_notify_, s,
        MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)s->opt.max_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        (unsigned)s->opt.max_connections_per_ip, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)s->opt.idle_timeout_s, MHD_OPTION_EXTERNAL_LOGGER, http_log_, NULL, MHD_OPTION_END);
    if (d == NULL) {
        snprintf(why, cap, "cannot listen on %s port %d (in use, or not an address of this machine)",
                 s->opt.bind, s->opt.port);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    *port = info != NULL ? info->port : s->opt.port;
    /* Connection threads may already read it (guard_). */
    pthread_mutex_lock(&s->mu);
    s->bound_port = *port;
    pthread_mutex_unlock(&s->mu);
    return d;
}

bool serve_http_start(server *s, char *why, size_t cap, int *port) {
    if (pthread_create(&s->watch_thread, NULL, watchdog_, s) != 0) {
        snprintf(why, cap, "cannot start a thread");
        return false;
    }
    s->watching = true;
    s->daemon = start_http_(s, why, cap, port);
    return s->daemon != NULL;
}

void serve_http_stop(server *s) {
    if (s->daemon != NULL) MHD_stop_daemon(s->daemon);
    s->daemon = NULL;
    if (s->watching) watchdog_stop_(s);
    s->watching = false;
}
