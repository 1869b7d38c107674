/*
 * test_cli_options.c -- the zdp commands' option loop (tools/zdp/cli.c):
 * cli_opt rows of every kind, their bounds, and the messages a bad value,
 * a missing value and an unknown option get; -h/--help.
 *
 * The tool is not a library, so this test compiles cli.c into itself (as
 * llm.c's test_gpt2.c includes train_gpt2.c) and reads the recorded
 * message from its file-private buffer.  Nothing here starts MPI: the
 * functions under test only record messages.
 */
#include "../../tools/zdp/cli.c"

#include <setjmp.h> /* cmocka needs these three first */
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

typedef struct opts_ {
    const char *name;
    int64_t steps;
    int layers;
    uint64_t seed;
    double frac;
    int mode;
    cli_schedule schedule;
    zdp_gpt_config model;
    cli_ckpt ckpt;
    int64_t max_skipped;
} opts_;

static const char *const modes_[] = {"on", "off", "auto", NULL};
static const int mode_values_[] = {1, 0, -1};

static const cli_command dashed_ = {.missing = "expected an option with a value (see --help)",
                                    .unknown = " (see --help)", .dashes = true};

/* Parses the words of `args` (space-separated, at most 32) against every
 * kind of row. */
static int parse_(const char *args, opts_ *o) {
    static char buf[512];
    char *argv[32];
    int argc = 0;
    snprintf(buf, sizeof buf, "%s", args);
    for (char *t = strtok(buf, " "); t != NULL && argc < 32; t = strtok(NULL, " ")) argv[argc++] = t;
    *o = (opts_){.model = CLI_GPT_DEFAULT, .mode = -1};
    const cli_opt rows[] = {
        CLI_STR("--name", &o->name),
        CLI_I64("--steps", &o->steps, 0, 100, "need an integer in 0..100"),
        CLI_INT("--layers", &o->layers, 1, 8, "need 1..8"),
        CLI_U64("--seed", &o->seed, 0, INT64_MAX, "need an integer >= 0"),
        CLI_F64("--frac", &o->frac, 0.0, 0.5, "need a number in [0, 0.5]"),
        CLI_CHOICE("--mode", &o->mode, modes_, mode_values_, "on, off or auto"),
        CLI_SCHEDULE("--schedule", &o->schedule),
        CLI_IGNORE("--model"),
        CLI_GPT_ROWS(&o->model),
        CLI_CKPT_ROWS(&o->ckpt),
        CLI_MAX_SKIPPED_ROW(&o->max_skipped),
    };
    pending_[0] = '\0';
    return cli_parse_options(&dashed_, rows, (int)(sizeof rows / sizeof rows[0]), argc, argv);
}

static void test_every_kind_is_stored(void **state) {
    (void)state;
    opts_ o;
    assert_int_equal(parse_("--name n --steps 100 --layers 8 --seed 18446744 --frac 0.5 --mode "
                            "auto --schedule 2,5,3 --model gpt --n-layer 3 --save-every 7 "
                            "--max-skipped-steps 0", &o), 0);
    assert_string_equal(o.name, "n");
    assert_int_equal(o.steps, 100);
    assert_int_equal(o.layers, 8);
    assert_int_equal(o.seed, 18446744u);
    assert_true(o.frac == 0.5);
    assert_int_equal(o.mode, -1);
    assert_int_equal(o.schedule.len, 3);
    assert_int_equal(o.schedule.n[1], 5);
    assert_int_equal(o.model.n_layer, 3);
    assert_int_equal(o.model.n_head, 4); /* untouched: the default */
    assert_int_equal(o.ckpt.save_every, 7);
    assert_int_equal(o.max_skipped, 0);
    assert_int_equal(parse_("--mode off", &o), 0);
    assert_int_equal(o.mode, 0);
    assert_int_equal(parse_("", &o), 0);
}

static void test_bad_values_name_flag_value_and_need(void **state) {
    (void)state;
    opts_ o;
    static const struct {
        const char *args, *msg;
    } cases[] = {
        {"--steps 101", "--steps 101: need an integer in 0..100"},
        {"--steps x", "--steps x: need an integer in 0..100"},
        {"--layers 0", "--layers 0: need 1..8"},
        {"--seed -1", "--seed -1: need an integer >= 0"},
        {"--frac 0.6", "--frac 0.6: need a number in [0, 0.5]"},
        {"--mode maybe", "--mode maybe: on, off or auto"},
        {"--n-embd 0", "--n-embd 0: need a positive integer"},
        {"--save-every 0", "--save-every 0: need an integer >= 1 (optimizer steps)"},
        {"--max-skipped-steps -1", "--max-skipped-steps -1: need an integer >= 0 (0 = never stop; "
                                   "default 100)"},
        {"--schedule 0", "--schedule: entry 1 = \"0\": each entry is a micro-batch count >= 1 "
                         "(for example --schedule 2,5,3)"},
        {"--bogus 1", "unknown option --bogus (see --help)"},
        {"--steps", "--steps: expected an option with a value (see --help)"},
        {"steps 1", "steps: expected an option with a value (see --help)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(parse_(cases[i].args, &o), 2);
        assert_string_equal(pending_, cases[i].msg);
    }
    pending_[0] = '\0';
}

static void test_help_anywhere_before_an_error(void **state) {
    (void)state;
    opts_ o;
    assert_int_equal(parse_("--help", &o), 1);
    assert_int_equal(parse_("--steps 3 -h", &o), 1);
    assert_int_equal(parse_("--steps 300 --help", &o), 2); /* the error comes first */
    pending_[0] = '\0';
}

static void test_take_option_and_undashed_commands(void **state) {
    (void)state;
    const char *to = NULL;
    const cli_opt rows[] = {CLI_STR("--to", &to)};
    assert_int_equal(cli_take_option(rows, 1, "--to", "x"), 1);
    assert_string_equal(to, "x");
    assert_int_equal(cli_take_option(rows, 1, "--from", "x"), 0);
    /* Without dashes, only a missing value or an unknown flag fails. */
    static const cli_command plain = {.missing = "missing value", .unknown = " for zdp ckpt"};
    char a0[] = "to", a1[] = "x", a2[] = "--to";
    char *argv[] = {a0, a1, a2};
    assert_int_equal(cli_parse_options(&plain, rows, 1, 2, argv), 2);
    assert_string_equal(pending_, "unknown option to for zdp ckpt");
    assert_int_equal(cli_parse_options(&plain, rows, 1, 1, argv + 2), 2);
    assert_string_equal(pending_, "--to: missing value");
    pending_[0] = '\0';
}

/* CLI_WORD: a non-empty string; CLI_LIST: repeatable, each a non-empty
 * string appended to a realloc'ed array; both may refuse characters. */
static void test_words_and_lists(void **state) {
    (void)state;
    const char *name = "default", **roots = NULL, **hosts = NULL;
    int n_roots = 0, n_hosts = 0;
    const cli_opt rows[] = {
        CLI_WORD("--name", &name, NULL, NULL),
        CLI_WORD("--tag", &name, "/", "a name without '/'"),
        CLI_LIST("--root", &roots, &n_roots, NULL, NULL),
        CLI_LIST("--host", &hosts, &n_hosts, ":/[", "a host name only"),
    };
    const int n = (int)(sizeof rows / sizeof rows[0]);
    char a[][16] = {"--root", "/a", "--host", "h1", "--name", "n", "--root", "/b", "--host", "h2"};
    char *argv[] = {a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9]};
    assert_int_equal(cli_parse_options(&dashed_, rows, n, 10, argv), 0);
    assert_string_equal(name, "n");
    assert_int_equal(n_roots, 2);
    assert_string_equal(roots[0], "/a");
    assert_string_equal(roots[1], "/b");
    assert_int_equal(n_hosts, 2);
    assert_string_equal(hosts[0], "h1");
    assert_string_equal(hosts[1], "h2");
    /* A bad value leaves the list as it was. */
    static const struct {
        const char *flag, *value, *msg;
    } cases[] = {
        {"--name", "", "--name: must not be empty"},
        {"--root", "", "--root: must not be empty"},
        {"--host", "", "--host: must not be empty"},
        {"--host", "h:80", "--host h:80: a host name only"},
        {"--host", "[::1]", "--host [::1]: a host name only"},
        {"--host", "http://h", "--host http://h: a host name only"},
        {"--tag", "a/b", "--tag a/b: a name without '/'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pending_[0] = '\0';
        assert_int_equal(cli_take_option(rows, n, cases[i].flag, cases[i].value), 2);
        assert_string_equal(pending_, cases[i].msg);
    }
    assert_string_equal(name, "n");
    assert_int_equal(n_hosts, 2);
    assert_int_equal(n_roots, 2);
    assert_int_equal(cli_take_option(rows, n, "--tag", "t"), 1);
    assert_string_equal(name, "t");
    free((void *)roots);
    free((void *)hosts);
    pending_[0] = '\0';
}

/* A switch stands alone: the next word is the next option, not its value. */
static void test_switches(void **state) {
    (void)state;
    int tie = -1, bias = 0;
    const char *name = NULL;
    const cli_opt rows[] = {
        CLI_FLAG("--tie", &tie, 1), CLI_FLAG("--no-tie", &tie, 0),
        CLI_FLAG("--bias", &bias, 1), CLI_WORD("--name", &name, NULL, NULL),
    };
    const int n = (int)(sizeof rows / sizeof rows[0]);
    char a[][16] = {"--tie", "--name", "x", "--bias", "--no-tie"};
    char *argv[] = {a[0], a[1], a[2], a[3], a[4]};
    assert_int_equal(cli_parse_options(&dashed_, rows, n, 5, argv), 0);
    assert_int_equal(tie, 0); /* the last one wins */
    assert_int_equal(bias, 1);
    assert_string_equal(name, "x");
    assert_int_equal(cli_parse_options(&dashed_, rows, n, 1, argv), 0);
    assert_int_equal(tie, 1);
    /* A value-taking option still needs its value after a switch. */
    pending_[0] = '\0';
    assert_int_equal(cli_parse_options(&dashed_, rows, n, 2, argv), 2);
    assert_string_equal(pending_, "--name: expected an option with a value (see --help)");
    /* Nor is a switch the value of the option before it. */
    char *argv2[] = {a[1], a[3], a[2]};
    pending_[0] = '\0';
    assert_int_equal(cli_parse_options(&dashed_, rows, n, 3, argv2), 2);
    assert_string_equal(pending_, "--name: expected an option with a value (see --help)");
    pending_[0] = '\0';
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_switches),
        cmocka_unit_test(test_every_kind_is_stored),
        cmocka_unit_test(test_bad_values_name_flag_value_and_need),
        cmocka_unit_test(test_help_anywhere_before_an_error),
        cmocka_unit_test(test_take_option_and_undashed_commands),
        cmocka_unit_test(test_words_and_lists),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
