/* The lab's pause container: holds a pod's namespaces until told to stop. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) { (void)sig; _exit(0); }
static void on_child(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }

int main(void) {
    signal(SIGINT, on_stop);
    signal(SIGTERM, on_stop);
    signal(SIGCHLD, on_child);
    for (;;) pause();
    return 0;
}
