/*
 * test_hparams.c -- zdp_hparams_check_capped: the one range check for
 * optimizer hyperparameters, with the tighter caps for a server's remote
 * client (docs/config.md, "optimizer"; docs/server.md, "POST /optim_step").
 */
#include <setjmp.h> /* cmocka needs these three first */
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "zdp/zdp.h"

static zdp_hparams good_(void) {
    return (zdp_hparams){.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                         .weight_decay = 0.01, .gradient_clipping = 1.0};
}

/* Whose values are checked: a program's (zdp_hparams_check) or a server's
 * remote client's, with the caps `zdp serve` puts on top (its
 * SERVE_CLIENT_LR_MAX and SERVE_CLIENT_CLIP_MAX, src/serve/serve_impl.h). */
typedef enum { FROM_PROGRAM, FROM_CLIENT } from_;
#define CLIENT_LR_MAX 10.0
#define CLIENT_CLIP_MAX 1e30

/* Is h accepted from `from`?  On refusal the message must name `field`. */
static bool ok_(const zdp_hparams *h, from_ from, const char *field) {
    zdp_error e = {0};
    zdp_status st = from == FROM_CLIENT ? zdp_hparams_check_capped(h, CLIENT_LR_MAX, CLIENT_CLIP_MAX, &e)
                                        : zdp_hparams_check(h, &e);
    if (st != ZDP_OK) {
        assert_int_equal(st, ZDP_ERR_INVALID_ARG);
        assert_non_null(strstr(e.msg, field));
    }
    return st == ZDP_OK;
}

static void test_client_caps(void **state) {
    (void)state;
    zdp_hparams h = good_();
    assert_true(ok_(&h, FROM_PROGRAM, ""));
    assert_true(ok_(&h, FROM_CLIENT, ""));
    /* lr: a program may go up to ZDP_HPARAM_LR_MAX, a client to 10. */
    h.lr = CLIENT_LR_MAX;
    assert_true(ok_(&h, FROM_CLIENT, "lr"));
    h.lr = 11.0;
    assert_false(ok_(&h, FROM_CLIENT, "lr = 11: must be in [0, 10]"));
    assert_true(ok_(&h, FROM_PROGRAM, "lr"));
    assert_true(zdp_hparams_check(&h, NULL) == ZDP_OK);
    h.lr = ZDP_HPARAM_LR_MAX;
    assert_true(ok_(&h, FROM_PROGRAM, "lr"));
    h.lr = 101.0;
    assert_false(ok_(&h, FROM_PROGRAM, "lr = 101: must be in [0, 100]"));
    assert_false(ok_(&h, FROM_CLIENT, "lr"));
    /* gradient_clipping: any finite norm from a program, 1e30 from a client. */
    h = good_();
    h.gradient_clipping = CLIENT_CLIP_MAX;
    assert_true(ok_(&h, FROM_CLIENT, "gradient_clipping"));
    h.gradient_clipping = 1e31;
    assert_false(ok_(&h, FROM_CLIENT, "gradient_clipping = 1e+31: must be in [0, 1e+30]"));
    assert_true(ok_(&h, FROM_PROGRAM, "gradient_clipping"));
    h.gradient_clipping = INFINITY;
    assert_false(ok_(&h, FROM_PROGRAM, "gradient_clipping"));
    /* The other ranges are the same for both. */
    for (int from = 0; from < 2; from++) {
        h = good_();
        h.beta1 = 1.0;
        assert_false(ok_(&h, (from_)from, "beta1"));
        h = good_();
        h.eps = 0.0;
        assert_false(ok_(&h, (from_)from, "eps"));
        h = good_();
        h.weight_decay = 10.5;
        assert_false(ok_(&h, (from_)from, "weight_decay"));
        h = good_();
        h.lr = NAN;
        assert_false(ok_(&h, (from_)from, "lr"));
    }
    assert_int_equal(zdp_hparams_check_capped(NULL, CLIENT_LR_MAX, CLIENT_CLIP_MAX, NULL), ZDP_ERR_INVALID_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_client_caps)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
