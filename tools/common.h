/* Small helpers shared by ticklab's measurement tools. */
#ifndef TICKLAB_COMMON_H
#define TICKLAB_COMMON_H

#include <stdio.h>
#include <string.h>

/* The first line of a (sysfs) file without its newline, or "unknown". */
static inline void read_first_line(const char *path, char *buf, size_t size)
{
	FILE *f = fopen(path, "r");
	snprintf(buf, size, "unknown");
	if (!f)
		return;
	if (fgets(buf, (int)size, f))
		buf[strcspn(buf, "\n")] = 0;
	fclose(f);
}

#define CURRENT_CLOCKSOURCE "/sys/devices/system/clocksource/clocksource0/current_clocksource"

#endif
