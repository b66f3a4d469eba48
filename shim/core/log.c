/* One line per message, written with a single fprintf so lines from ranks
 * sharing a terminal do not interleave mid-line. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

static const char *const level_tags[] = {"ERROR", "WARN", "INFO", "DEBUG"};

static void emit(const char *tag, const char *fmt, va_list ap) {
    char host[64] = "?";
    gethostname(host, sizeof host - 1);
    char msg[4096]; /* the banner holds every variable, paths among them */
    vsnprintf(msg, sizeof msg, fmt, ap);
    char job[24] = "";
    if (dgc_config_job() > 0) snprintf(job, sizeof job, " job %d", dgc_config_job());
    if (dgc_config_job() < 0) snprintf(job, sizeof job, " spawned");
    fprintf(stderr, "%s:%d rank %d%s dgcshim %s %s\n", host, (int)getpid(), dgc_config_rank(), job, tag, msg);
    fflush(stderr);
}

void dgc_log(dgc_log_level level, const char *fmt, ...) {
    if (level != DGC_LOG_ERROR && (int)level > dgc_config_current()->log_level) return;
    va_list ap;
    va_start(ap, fmt);
    emit(level_tags[level], fmt, ap);
    va_end(ap);
}

void dgc_log_tagged(const char *tag, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    emit(tag, fmt, ap);
    va_end(ap);
}
