#!/bin/bash
# Simulates an agent that never stops.
sleep 3600
echo done > /app/done.txt
