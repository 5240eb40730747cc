/* The smallest program that embeds libectransfer: prints the version and
 * the sentence for one error code. Built by tests/cli/install.sh through
 * pkg-config against an installed copy of the library. */
#include <stdio.h>

#include <ectransfer.h>

int main(void) {
    printf("ectransfer %s; ECT_EFULL means \"%s\"\n", ect_version(), ect_strerror(ECT_EFULL));
    return ect_dtype_size("torch.bfloat16") == 2 ? 0 : 1;
}
