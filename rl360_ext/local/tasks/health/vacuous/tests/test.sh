#!/bin/bash
# A verifier that passes whatever the agent did: it writes the maximum without reading the answer.
echo 1 > /logs/verifier/reward.txt
