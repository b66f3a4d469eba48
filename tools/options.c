/* dgcshim-options: the library's option table and parser as a program, so
 * that the `dgcshim` command never keeps a copy of either.
 *
 *   dgcshim-options table   every variable as JSON: name, default, range,
 *                           whether all ranks must agree, one line of meaning
 *   dgcshim-options check   parses this environment's DGC_* variables as the
 *                           library does: exit 0, or 2 with its message
 *   dgcshim-options engine  the host engine's variant on this CPU */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dgcshim/config.h"
#include "engine/stream.h"

static void json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20) printf("\\u%04x", (unsigned char)*s);
        else putchar(*s);
    }
    putchar('"');
}

static int table(void) {
    printf("[");
    for (int i = 0; i < DGC_OPT_COUNT; i++) {
        dgc_option o = (dgc_option)i;
        printf("%s\n {\"name\": ", i ? "," : "");
        json_string(dgc_option_name(o));
        printf(", \"default\": ");
        json_string(dgc_option_default(o));
        printf(", \"range\": ");
        json_string(dgc_option_range(o));
        printf(", \"all_ranks\": %s, \"summary\": ", dgc_option_is_collective(o) ? "true" : "false");
        json_string(dgc_option_summary(o));
        printf("}");
    }
    printf("\n]\n");
    return 0;
}

static const char *env(const char *name) { return getenv(name); }

static int check(void) {
    dgc_config cfg;
    char err[512];
    if (dgc_config_parse(&cfg, env, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "table") == 0) return table();
    if (argc == 2 && strcmp(argv[1], "check") == 0) return check();
    if (argc == 2 && strcmp(argv[1], "engine") == 0) return printf("%s\n", dgc_stream_variant_name()) < 0;
    fprintf(stderr, "usage: dgcshim-options table|check|engine\n");
    return 64;
}
