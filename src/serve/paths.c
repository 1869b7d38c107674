/*
 * paths.c -- the paths a client may name (docs/server.md, "Threat model"):
 * a relative name inside --checkpoint-dir, or an absolute path inside a
 * --allow-path-root folder, never through "." or ".." or a symbolic link
 * that leads outside; and the payload of the ops that take one.
 */
#define _POSIX_C_SOURCE 200809L
#define _XOPEN_SOURCE 700 /* realpath */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "serve_impl.h"

/* Is p root itself or below it?  Both are absolute, without "." or "..". */
bool serve_inside(const char *p, const char *root) {
    size_t n = strlen(root);
    while (n > 1 && root[n - 1] == '/') n--;
    if (n == 1 && root[0] == '/') return true;
    return strncmp(p, root, n) == 0 && (p[n] == '\0' || p[n] == '/');
}

bool serve_resolve_path(const server *s, const char *field, const char *name, char *out, size_t cap,
                        verr *e) {
    const size_t n = strlen(name);
    if (n == 0 || n > 4000)
        return serve_bad(e, 400, field, "%s: must be a name of 1 to 4000 bytes inside the server's "
                         "checkpoint folder, such as \"run1/step10\"", field);
    for (const char *p = name; *p;) {
        while (*p == '/') p++;
        const char *q = p;
        while (*q && *q != '/') q++;
        if ((q - p == 1 && p[0] == '.') || (q - p == 2 && p[0] == '.' && p[1] == '.'))
            return serve_bad(e, 400, field, "%s = \"%s\": \".\" and \"..\" are not allowed in a path; send a "
                             "name inside the server's checkpoint folder, such as \"run1/step10\"", field, name);
        p = q;
    }
    /* The same answer whether or not anything outside exists. */
    char outside[1400];
    snprintf(outside, sizeof outside, "%s = \"%.1000s\": outside the folders this server may use; send a name "
             "inside its checkpoint folder (--checkpoint-dir), such as \"run1/step10\" (the operator can allow "
             "other folders for absolute paths with --allow-path-root DIR)", field, name);
    char root[PATH_MAX], real[PATH_MAX], full[PATH_MAX + 4096], pre[PATH_MAX + 4096];
    if (serve_mkdirs(s->opt.checkpoint_dir) != 0 || realpath(s->opt.checkpoint_dir, root) == NULL)
        return serve_bad(e, 500, field, "%s: cannot create the checkpoint folder %s: %s (--checkpoint-dir)",
                         field, s->opt.checkpoint_dir, strerror(errno));
    if (name[0] == '/') {
        /* An absolute path: only inside a folder the operator named (checked
         * again on the real path below); nothing else is looked at. */
        bool listed = serve_inside(name, root);
        for (int i = 0; i < s->opt.n_allow_roots && !listed; i++)
            listed = serve_inside(name, s->roots_real[i]) ||
                     (s->opt.allow_roots[i][0] == '/' && serve_inside(name, s->opt.allow_roots[i]));
        if (!listed) return serve_bad(e, 400, field, "%s", outside);
        snprintf(full, sizeof full, "%s", name);
    } else {
        snprintf(full, sizeof full, "%s/%s", root, name);
    }
    size_t len = strlen(full);
    while (len > 1 && full[len - 1] == '/') full[--len] = '\0';
    /* The longest prefix that exists (lstat: a link at the end counts, even a
     * dangling one), resolved with realpath: a symbolic link anywhere in it
     * that leads outside shows.  What follows does not exist yet, so it holds
     * no link. */
    snprintf(pre, sizeof pre, "%s", full);
    struct stat sb;
    while (lstat(pre, &sb) != 0) {
        char *slash = strrchr(pre, '/');
        if (slash == pre) {
            pre[1] = '\0';
            break;
        }
        *slash = '\0';
    }
    if (realpath(pre, real) == NULL) return serve_bad(e, 400, field, "%s", outside);
    const char *rest = full + strlen(pre);
    while (*rest == '/') rest++;
    const size_t rl = strlen(real);
    if (snprintf(out, cap, "%s%s%s", real, *rest && real[rl - 1] != '/' ? "/" : "", rest) >= (int)cap)
        return serve_bad(e, 400, field, "%s = \"%.1000s\": too long", field, name);
    bool ok = serve_inside(out, root);
    for (int i = 0; i < s->opt.n_allow_roots && !ok; i++) ok = serve_inside(out, s->roots_real[i]);
    if (!ok) return serve_bad(e, 400, field, "%s", outside);
    return true;
}

/* The payload of a path op: the path, NUL-terminated.  save_state and
 * load_state run on every rank: their path goes relative to the checkpoint
 * folder, which each rank resolves against its own --checkpoint-dir. */
bool serve_set_path(const server *s, job *j, const char *path, verr *e) {
    if ((j->op == OP_SAVE_STATE || j->op == OP_LOAD_STATE) && serve_inside(path, s->ckpt_root)) {
        path += strlen(s->ckpt_root);
        while (*path == '/') path++;
        if (*path == '\0') return serve_bad(e, 400, "path", "path: needs a name inside the checkpoint folder");
    }
    size_t n = strlen(path);
    j->payload = malloc(n + 1);
    if (j->payload == NULL) return serve_bad(e, 500, "path", "out of memory");
    memcpy(j->payload, path, n + 1);
    j->nbytes = (int64_t)n + 1;
    return true;
}

